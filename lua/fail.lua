-- fail.lua: record a failed attempt: re-park the job for a retry after the
-- backoff delay (computed above the wire), or move it to the failed set.
--
-- KEYS[1] job hash       emq:{q}:job:<id>
-- KEYS[2] active zset    emq:{q}:active
-- KEYS[3] leases hash    emq:{q}:leases
-- KEYS[4] failed zset    emq:{q}:failed (score = finish time, server ms)
-- KEYS[5] delayed zset   emq:{q}:delayed
-- KEYS[6] pending zset   emq:{q}:pending
-- KEYS[7] marker zset    emq:{q}:marker
-- KEYS[8] meta hash      emq:{q}:meta
-- KEYS[9] events stream  emq:{q}:events
-- KEYS[10] metrics hash  emq:{q}:metrics
-- KEYS[11] waiters hash  emq:{q}:waiters (ref.wait: told on the job's done channel)
-- KEYS[12] dependents    emq:{q}:dependents (hash: jobs other jobs depend on)
-- KEYS[13] outbox list   emq:{q}:outbox ("failed\0<id>" when a job with dependents fails for good)
-- ARGV[1] job id
-- ARGV[2] lease token from claim.lua
-- ARGV[3] retry delay ms (>= 0), or -1 for no retry (last attempt / unrecoverable)
-- ARGV[4] error message
-- ARGV[5] traceback text
-- ARGV[6] keyspace version of the caller
-- Returns: {1 re-parked for a retry or 0 moved to the failed set, wait ms, run ms}: the
--          times as complete.lua returns them, for the caller's histograms; {flag, -1, -1}
--          when this very token already wrote this outcome (a call re-sent after its reply
--          was lost: nothing is rewritten; the job hash's 'ftok' names the token whose fail
--          outcome was written last)
-- Errors:  EMQLEASE the lease is no longer held by this worker; EMQINPUT bad delay;
--          EMQVERSION keyspace of another major version; NOPERM the ACL denies PUBLISH on
--          the done channels or RPUSH (before any write)
--@include common
--@include metrics
--@include finished

local delay = tonumber(ARGV[3])
if not delay or delay % 1 ~= 0 or delay < -1 then
  return redis.error_reply('EMQINPUT retry delay must be an integer >= -1')
end
local flag = delay < 0 and 0 or 1
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
  -- tokens are unique: a recorded outcome of ours is this same call, re-sent
  if redis.call('HGET', KEYS[1], 'ftok') == ARGV[2] then return {flag, -1, -1} end
  return redis.error_reply('EMQLEASE lease on ' .. ARGV[1] .. ' is no longer held by this worker')
end
local hook, denied = emq_finish_prepare(KEYS[11], KEYS[12], KEYS[13])
if denied then return redis.error_reply(denied) end
local err = emq_fence(KEYS[8], ARGV[6])
if err then return redis.error_reply(err) end
local now = emq_now()
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local wait, run, attempt = emq_run_times(KEYS[1], now)
local cap = emq_events_cap(KEYS[8])
if delay < 0 then
  redis.call('HSET', KEYS[1], 'state', 'failed', 'error', ARGV[4], 'traceback', ARGV[5],
    'finished', emq_int(now), 'ftok', ARGV[2])
  redis.call('ZADD', KEYS[4], now, ARGV[1])
  redis.call('HINCRBY', KEYS[10], 'failed', 1)
  emq_event(KEYS[9], cap, 'failed', 'id', ARGV[1], 'attempt', attempt, 'error', ARGV[4])
  emq_finished(hook, KEYS[11], KEYS[12], KEYS[13], {ARGV[1]}, 'failed')
  return {0, wait, run}
end
local ps = tonumber(redis.call('HGET', KEYS[1], 'ps') or '0')
if delay > 0 then
  -- a delay past the representable range waits as long as we can say, it does not
  -- turn into an immediate retry
  local run_at = math.min(now + delay, EMQ_EPOCH + EMQ_MAX_OFFSET)
  redis.call('HSET', KEYS[1], 'error', ARGV[4], 'traceback', ARGV[5], 'run_at', emq_int(run_at),
    'ftok', ARGV[2])
  redis.call('HDEL', KEYS[1], 'state')  -- waiting again: its set says where
  redis.call('ZADD', KEYS[5], emq_delayed_score(KEYS[5], run_at), ARGV[1])
  emq_wake_at(KEYS[7], run_at)
else
  -- no delay: straight back to pending, at its original place in its tier
  redis.call('HSET', KEYS[1], 'error', ARGV[4], 'traceback', ARGV[5], 'ftok', ARGV[2])
  redis.call('HDEL', KEYS[1], 'state')
  redis.call('ZADD', KEYS[6], ps, ARGV[1])
  emq_wake(KEYS[7])
end
redis.call('HINCRBY', KEYS[10], 'retried', 1)
emq_event(KEYS[9], cap, 'retrying', 'id', ARGV[1], 'attempt', attempt, 'delay', emq_int(delay),
  'error', ARGV[4])
return {1, wait, run}
