-- complete.lua: record a job's success, if and only if the caller still holds its lease.
--
-- KEYS[1] job hash        emq:{q}:job:<id>
-- KEYS[2] active zset     emq:{q}:active
-- KEYS[3] leases hash     emq:{q}:leases
-- KEYS[4] completed zset  emq:{q}:completed (score = finish time, server ms)
-- ARGV[1] job id
-- ARGV[2] lease token from claim.lua
-- ARGV[3] result (JSON text)
-- Returns: 1
-- Errors:  EMQLEASE the lease expired and the job was reaped, re-claimed or already ended
--@include common

if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
  return redis.error_reply('EMQLEASE lease on ' .. ARGV[1] .. ' is no longer held by this worker')
end
local now = emq_now()
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'state', 'completed', 'result', ARGV[3], 'finished', emq_int(now))
redis.call('ZADD', KEYS[4], now, ARGV[1])
return 1
