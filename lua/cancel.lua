-- cancel.lua: cancel a job that has not started (scheduled or pending), atomically.
-- Active jobs are not cancelled here (their handler owns them until it ends). The job
-- keeps a record: its hash stays, `state` = cancelled and `finished` = now, and it joins
-- the cancelled set (trimmed by retention like the completed and failed sets).
--
-- KEYS[1] job hash        emq:{q}:job:<id>
-- KEYS[2] pending zset    emq:{q}:pending (or the job's group lane)
-- KEYS[3] delayed zset    emq:{q}:delayed
-- KEYS[4] meta hash       emq:{q}:meta
-- KEYS[5] events stream   emq:{q}:events
-- KEYS[6] cancelled zset  emq:{q}:cancelled
-- ARGV[1] job id
-- ARGV[2] keyspace version of the caller
-- Returns: 1 cancelled (its record kept), 0 not cancellable (unknown, active, finished or
--          already cancelled; nothing written)
-- Errors:  EMQVERSION keyspace of another major version
--@include common

-- read first: a call that cancels nothing must not write (not even the fence's stamp)
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) and not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  return 0
end
local err = emq_fence(KEYS[4], ARGV[2])
if err then return redis.error_reply(err) end
local now = emq_now()
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'finished', now)
  redis.call('ZADD', KEYS[6], now, ARGV[1])
end
emq_event(KEYS[5], emq_events_cap(KEYS[4]), 'cancelled', 'id', ARGV[1])
return 1
