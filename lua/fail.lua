-- fail.lua: record a failed attempt: re-park the job for a retry after the
-- backoff delay (computed above the wire), or move it to the failed set.
--
-- KEYS[1] job_key          job hash        emq:{q}:job:<id>
-- KEYS[2] active_key       active zset     emq:{q}:active
-- KEYS[3] leases_key       leases hash     emq:{q}:leases
-- KEYS[4] failed_key       failed zset     emq:{q}:failed (score = finish time, server ms)
-- KEYS[5] delayed_key      delayed zset    emq:{q}:delayed
-- KEYS[6] pending_key      pending zset    emq:{q}:pending
-- KEYS[7] marker_key       marker zset     emq:{q}:marker
-- KEYS[8] meta_key         meta hash       emq:{q}:meta
-- KEYS[9] events_key       events stream   emq:{q}:events
-- KEYS[10] metrics_key     metrics hash    emq:{q}:metrics
-- KEYS[11] waiters_key     waiters hash    emq:{q}:waiters (ref.wait: told on the job's done
--          channel)
-- KEYS[12] dependents_key  dependents      emq:{q}:dependents (hash: jobs other jobs depend on)
-- KEYS[13] outbox_key      outbox list     emq:{q}:outbox ("failed\0<id>" when a job with
--          dependents fails for good)
-- ARGV[1] id               job id
-- ARGV[2] token            lease token from claim.lua
-- ARGV[3] retry_delay_ms   retry delay ms (>= 0), or -1 for no retry (last attempt / unrecoverable)
-- ARGV[4] message          error message
-- ARGV[5] traceback        traceback text
-- ARGV[6] version          keyspace version of the caller
-- Returns: {1 re-parked for a retry or 0 moved to the failed set, wait ms, run ms}: the
--          times as complete.lua returns them, for the caller's histograms; {flag, -1, -1}
--          when this very token already wrote this outcome (a call re-sent after its reply
--          was lost: nothing is rewritten; the job hash's 'ftok' names the token whose fail
--          outcome was written last)
-- Errors:  EMQLEASE the lease is no longer held by this worker; EMQGONE the job's hash is
--          gone while leased (the queue's keys were deleted); EMQINPUT bad delay;
--          EMQVERSION keyspace of another major version; NOPERM the ACL denies PUBLISH on
--          the done channels or RPUSH (before any write); EMQKEYTYPE the active set, the
--          set the job goes to (failed, delayed or pending), the marker, the metrics hash,
--          the events stream or (with dependents) the outbox holds another type (before
--          any write)
--@include common
--@include metrics
--@include finished

local job_key = KEYS[1]
local active_key = KEYS[2]
local leases_key = KEYS[3]
local failed_key = KEYS[4]
local delayed_key = KEYS[5]
local pending_key = KEYS[6]
local marker_key = KEYS[7]
local meta_key = KEYS[8]
local events_key = KEYS[9]
local metrics_key = KEYS[10]
local waiters_key = KEYS[11]
local dependents_key = KEYS[12]
local outbox_key = KEYS[13]
local id = ARGV[1]
local token = ARGV[2]
local retry_delay_ms = ARGV[3]
local message = ARGV[4]
local traceback = ARGV[5]
local version = ARGV[6]

local delay = tonumber(retry_delay_ms)
if not delay or delay % 1 ~= 0 or delay < -1 then
  return redis.error_reply('EMQINPUT retry delay must be an integer >= -1')
end
local flag = delay < 0 and 0 or 1
if redis.call('HGET', leases_key, id) ~= token then
  -- tokens are unique: a recorded outcome of ours is this same call, re-sent
  if redis.call('HGET', job_key, 'ftok') == token then return {flag, -1, -1} end
  local lost = emq_lease_lost(job_key, id, meta_key)
  return redis.error_reply(lost)
end
local hook, denied = emq_finish_prepare(waiters_key, dependents_key, outbox_key)
if denied then return redis.error_reply(denied) end
-- Every read before the first write (the job hash's included: a key of another type
-- fails a read with nothing written), then the keys this outcome writes, by type.
local cap = emq_events_cap(meta_key)
local wrong = emq_key_type_error(active_key, 'zset')
  or (delay < 0 and emq_key_type_error(failed_key, 'zset'))
  or (delay > 0 and emq_key_type_error(delayed_key, 'zset'))
  or (delay == 0 and emq_key_type_error(pending_key, 'zset'))
  or (delay >= 0 and emq_key_type_error(marker_key, 'zset'))
  or emq_key_type_error(metrics_key, 'hash') or (cap and emq_key_type_error(events_key, 'stream'))
if wrong then return redis.error_reply(wrong) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local now = emq_now()
local wait, run, attempt = emq_run_times(job_key, now)
local ps = delay == 0 and tonumber(redis.call('HGET', job_key, 'ps') or '0')
-- a delay past the representable range waits as long as we can say, it does not
-- turn into an immediate retry
local run_at = delay > 0 and math.min(now + delay, EMQ_EPOCH + EMQ_MAX_OFFSET)
local score = run_at and emq_delayed_score(delayed_key, run_at)
redis.call('HDEL', leases_key, id)
redis.call('ZREM', active_key, id)
if delay < 0 then
  redis.call('HSET', job_key, 'state', 'failed', 'error', message, 'traceback', traceback,
    'finished', emq_int(now), 'ftok', token)
  redis.call('ZADD', failed_key, now, id)
  redis.call('HINCRBY', metrics_key, 'failed', 1)
  emq_event(events_key, cap, 'failed', 'id', id, 'attempt', attempt, 'error', message)
  emq_finished(hook, waiters_key, dependents_key, outbox_key, {id}, 'failed')
  return {0, wait, run}
end
if delay > 0 then
  redis.call('HSET', job_key, 'error', message, 'traceback', traceback, 'run_at', emq_int(run_at),
    'ftok', token)
  redis.call('HDEL', job_key, 'state')  -- waiting again: its set says where
  redis.call('ZADD', delayed_key, score, id)
  emq_wake_at(marker_key, run_at)
else
  -- no delay: straight back to pending, at its original place in its tier
  redis.call('HSET', job_key, 'error', message, 'traceback', traceback, 'ftok', token)
  redis.call('HDEL', job_key, 'state')
  redis.call('ZADD', pending_key, ps, id)
  emq_wake(marker_key)
end
redis.call('HINCRBY', metrics_key, 'retried', 1)
emq_event(events_key, cap, 'retrying', 'id', id, 'attempt', attempt, 'delay', emq_int(delay),
  'error', message)
return {1, wait, run}
