-- release.lua: hand a claimed job back to pending untouched (graceful shutdown:
-- the worker stops before the handler ran or finished). The attempt it had
-- started is not counted.
--
-- KEYS[1] job hash       emq:{q}:job:<id>
-- KEYS[2] active zset    emq:{q}:active
-- KEYS[3] leases hash    emq:{q}:leases
-- KEYS[4] pending zset   emq:{q}:pending
-- KEYS[5] marker zset    emq:{q}:marker
-- KEYS[6] meta hash      emq:{q}:meta
-- KEYS[7] events stream  emq:{q}:events
-- ARGV[1] job id
-- ARGV[2] lease token from claim.lua
-- ARGV[3] keyspace version of the caller
-- Returns: 1 released, 0 the lease was no longer held (nothing changed)
-- Errors:  EMQVERSION keyspace of another major version
--@include common

if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
  return 0
end
local err = emq_fence(KEYS[6], ARGV[3])
if err then return redis.error_reply(err) end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'state') == 'active' then
    redis.call('HINCRBY', KEYS[1], 'attempts', -1)
  end
  redis.call('HDEL', KEYS[1], 'state')  -- waiting again: its set says where
  redis.call('ZADD', KEYS[4], redis.call('HGET', KEYS[1], 'ps'), ARGV[1])
  emq_wake(KEYS[5])
  emq_event(KEYS[7], emq_events_cap(KEYS[6]), 'released', 'id', ARGV[1])
end
return 1
