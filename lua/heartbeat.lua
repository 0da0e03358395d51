-- heartbeat.lua: record that one worker of the queue is alive (the dashboard's Workers page).
-- The worker's hash expires by itself (PEXPIRE ttl); the registry zset is scored by the last
-- beat, drops the entries older than ttl on every write, and expires with its last worker.
--
-- KEYS[1] worker hash    emq:{q}:worker:<token>
-- KEYS[2] workers zset   emq:{q}:workers
-- KEYS[3] meta hash      emq:{q}:meta
-- ARGV[1] worker token (its name: host:pid:nonce unless the caller chose one)
-- ARGV[2] ttl ms: how long this beat counts (about three beats), 1 .. 3600000
-- ARGV[3] keyspace version of the caller
-- ARGV[4..] field, value pairs to store (host, pid, queues, concurrency, in_hand, ...),
--          at most 16 pairs
-- Returns: the server ms stamped as the beat, or 0 when the registry already holds
--          10000 workers (nothing written)
-- Errors:  EMQINPUT bad ttl, an odd or too long field list;
--          EMQVERSION keyspace of another major version
--@include common

local ttl = tonumber(ARGV[2])
if not ttl or ttl ~= math.floor(ttl) or ttl < 1 or ttl > 3600000 then
  return redis.error_reply('EMQINPUT heartbeat ttl must be 1..3600000 ms, got ' .. ARGV[2])
end
local pairs_len = #ARGV - 3
if pairs_len % 2 ~= 0 or pairs_len > 32 then
  return redis.error_reply('EMQINPUT heartbeat takes at most 16 field/value pairs')
end
local now = emq_now()
local stale = now - ttl
-- bounded: a full registry refuses a newcomer instead of growing (stale entries go on
-- the next beat of any live worker, and the whole zset expires ttl after the last one)
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) and redis.call('ZCARD', KEYS[2]) >= 10000 then
  return 0
end
local err = emq_fence(KEYS[3], ARGV[3])
if err then return redis.error_reply(err) end
redis.call('HSET', KEYS[1], 'beat', now)
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', stale)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('PEXPIRE', KEYS[2], ttl)
return now
