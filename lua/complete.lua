-- complete.lua: record a job's success, if and only if the caller still holds its lease.
--
-- KEYS[1] job hash        emq:{q}:job:<id>
-- KEYS[2] active zset     emq:{q}:active
-- KEYS[3] leases hash     emq:{q}:leases
-- KEYS[4] completed zset  emq:{q}:completed (score = finish time, server ms)
-- KEYS[5] meta hash       emq:{q}:meta
-- KEYS[6] events stream   emq:{q}:events
-- KEYS[7] metrics hash    emq:{q}:metrics
-- ARGV[1] job id
-- ARGV[2] lease token from claim.lua
-- ARGV[3] result (JSON text)
-- ARGV[4] keyspace version of the caller
-- Returns: {wait ms, run ms} of the run: due -> started and started -> now, for the
--          caller's histograms (metrics_add.lua); -1 for a time not known, and
--          {-1, -1} when this very token already completed the job (a re-sent ack)
-- Errors:  EMQLEASE the lease expired and the job was reaped, re-claimed or already ended;
--          EMQVERSION keyspace of another major version
--@include common
--@include metrics

if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then
  -- An ack re-sent after a lost reply (connection dropped, Redis restarted) finds its
  -- own completion: tokens are unique, so this is the same outcome, not a takeover.
  local f = redis.call('HMGET', KEYS[1], 'state', 'worker')
  if f[1] == 'completed' and f[2] == ARGV[2] then return {-1, -1} end  -- timed already
  return redis.error_reply('EMQLEASE lease on ' .. ARGV[1] .. ' is no longer held by this worker')
end
local err = emq_fence(KEYS[5], ARGV[4])
if err then return redis.error_reply(err) end
local now = emq_now()
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local wait, run, attempt = emq_run_times(KEYS[1], now)  -- one read: times + attempt
redis.call('HSET', KEYS[1], 'state', 'completed', 'result', ARGV[3], 'finished', emq_int(now))
redis.call('ZADD', KEYS[4], now, ARGV[1])
redis.call('HINCRBY', KEYS[7], 'completed', 1)
emq_event(KEYS[6], emq_events_cap(KEYS[5]), 'completed', 'id', ARGV[1],
  'attempt', attempt)
return {wait, run}
