-- reap.lua: return jobs whose lease expired (worker died or stalled) to pending,
-- on the server clock; a job that stalled more than max_stalled times fails
-- with reason "stalled". The stalled attempt is not counted against `attempts`.
--
-- KEYS[1] active_key       active zset     emq:{q}:active
-- KEYS[2] leases_key       leases hash     emq:{q}:leases
-- KEYS[3] pending_key      pending zset    emq:{q}:pending
-- KEYS[4] failed_key       failed zset     emq:{q}:failed
-- KEYS[5] marker_key       marker zset     emq:{q}:marker
-- KEYS[6] meta_key         meta hash       emq:{q}:meta
-- KEYS[7] events_key       events stream   emq:{q}:events
-- KEYS[8] metrics_key      metrics hash    emq:{q}:metrics
-- KEYS[9] waiters_key      waiters hash    emq:{q}:waiters (ref.wait: told when a stalled job
--          fails for good)
-- KEYS[10] dependents_key  dependents      emq:{q}:dependents (hash: jobs other jobs depend on)
-- KEYS[11] outbox_key      outbox list     emq:{q}:outbox ("failed\0<id>" for such a job with
--          dependents)
-- KEYS[12..] job hashes  emq:{q}:job:<id>, one per ARGV[3..] id, same order
-- ARGV[1] max_stalled_arg  max_stalled (>= 0)
-- ARGV[2] version          keyspace version of the caller
-- ARGV[3..] job ids (from due.lua on the active set; re-checked here), at most 4000
-- Returns: {requeued, failed}
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts, bad max_stalled or more than 4000 ids;
--          EMQVERSION keyspace of another major version; NOPERM the ACL denies what the
--          finish hook needs (7.0+: before any write)
--@include common
--@include finished

local active_key = KEYS[1]
local leases_key = KEYS[2]
local pending_key = KEYS[3]
local failed_key = KEYS[4]
local marker_key = KEYS[5]
local meta_key = KEYS[6]
local events_key = KEYS[7]
local metrics_key = KEYS[8]
local waiters_key = KEYS[9]
local dependents_key = KEYS[10]
local outbox_key = KEYS[11]
local max_stalled_arg = ARGV[1]
local version = ARGV[2]

local max_stalled = tonumber(max_stalled_arg)
if not max_stalled or max_stalled < 0 or max_stalled % 1 ~= 0 or #ARGV < 2
    or #ARGV - 2 ~= #KEYS - 11 then
  return redis.error_reply('EMQINPUT reap needs max_stalled and one job key per id')
end
if #ARGV - 2 > EMQ_MAX_BATCH then
  return redis.error_reply('EMQINPUT reap takes at most ' .. EMQ_MAX_BATCH .. ' ids per call')
end
local hook, denied = emq_finish_prepare(waiters_key, dependents_key, outbox_key)
if denied then return redis.error_reply(denied) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local now = emq_now()
local cap = emq_events_cap(meta_key)
local requeued, failed = 0, 0
local ended = {}  -- failed for good: their waiters and dependents are told
for i = 3, #ARGV do
  local id, key = ARGV[i], KEYS[i + 9]
  local deadline = redis.call('ZSCORE', active_key, id)
  if deadline and tonumber(deadline) <= now then
    redis.call('ZREM', active_key, id)
    redis.call('HDEL', leases_key, id)
    if redis.call('EXISTS', key) == 1 then
      if redis.call('HGET', key, 'state') == 'active' then
        redis.call('HINCRBY', key, 'attempts', -1)  -- the stalled run did not finish
      end
      local stalls = redis.call('HINCRBY', key, 'stalls', 1)
      redis.call('HINCRBY', metrics_key, 'stalled', 1)
      emq_event(events_key, cap, 'stalled', 'id', id, 'stalls', stalls)
      if stalls > max_stalled then
        redis.call('HSET', key, 'state', 'failed', 'error', 'stalled',
          'traceback', 'job stalled more than ' .. max_stalled_arg .. ' times (lease expired)',
          'finished', emq_int(now))
        redis.call('ZADD', failed_key, now, id)
        redis.call('HINCRBY', metrics_key, 'failed', 1)
        emq_event(events_key, cap, 'failed', 'id', id, 'error', 'stalled')
        failed = failed + 1
        ended[#ended + 1] = id
      else
        redis.call('HDEL', key, 'state')  -- waiting again: its set says where
        redis.call('ZADD', pending_key, redis.call('HGET', key, 'ps'), id)
        requeued = requeued + 1
      end
    end
  end
end
if requeued > 0 then emq_wake(marker_key) end
emq_finished(hook, waiters_key, dependents_key, outbox_key, ended, 'failed')
return {requeued, failed}
