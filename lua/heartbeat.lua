-- heartbeat.lua: record that one worker of the queue is alive (the dashboard's Workers page).
-- The worker's hash expires by itself (PEXPIRE ttl); the registry zset is scored by the last
-- beat, drops the entries older than ttl on every write, and expires with its last worker.
--
-- KEYS[1] worker_key    worker hash     emq:{q}:worker:<token>
-- KEYS[2] workers_key   workers zset    emq:{q}:workers
-- KEYS[3] meta_key      meta hash       emq:{q}:meta
-- ARGV[1] worker_token  worker token (its name: host:pid:nonce unless the caller chose one)
-- ARGV[2] ttl_ms        ttl ms: how long this beat counts (about three beats), 1 .. 3600000
-- ARGV[3] version       keyspace version of the caller
-- ARGV[4..] field, value pairs to store (host, pid, queues, concurrency, in_hand, ...),
--          at most 16 pairs
-- Returns: the server ms stamped as the beat, or 0 when the registry already holds
--          10000 workers (nothing written)
-- Errors:  EMQINPUT bad ttl, an odd or too long field list;
--          EMQVERSION keyspace of another major version
--@include common

local worker_key = KEYS[1]
local workers_key = KEYS[2]
local meta_key = KEYS[3]
local worker_token = ARGV[1]
local ttl_ms = ARGV[2]
local version = ARGV[3]

local ttl = tonumber(ttl_ms)
if not ttl or ttl ~= math.floor(ttl) or ttl < 1 or ttl > 3600000 then
  return redis.error_reply('EMQINPUT heartbeat ttl must be 1..3600000 ms, got ' .. ttl_ms)
end
local pairs_len = #ARGV - 3
if pairs_len % 2 ~= 0 or pairs_len > 32 then
  return redis.error_reply('EMQINPUT heartbeat takes at most 16 field/value pairs')
end
local now = emq_now()
local stale = now - ttl
-- bounded: a full registry refuses a newcomer instead of growing (stale entries go on
-- the next beat of any live worker, and the whole zset expires ttl after the last one)
if not redis.call('ZSCORE', workers_key, worker_token)
    and redis.call('ZCARD', workers_key) >= 10000 then
  return 0
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
redis.call('HSET', worker_key, 'beat', now)
for i = 4, #ARGV, 2 do
  redis.call('HSET', worker_key, ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', worker_key, ttl)
redis.call('ZREMRANGEBYSCORE', workers_key, '-inf', stale)
redis.call('ZADD', workers_key, now, worker_token)
redis.call('PEXPIRE', workers_key, ttl)
return now
