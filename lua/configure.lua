-- configure.lua: set one per-queue setting in the meta hash (events cap, rate limit).
-- Settings live in meta so every producer and worker of the queue sees the same ones.
--
-- KEYS[1] meta_key    meta hash       emq:{q}:meta
-- KEYS[2] marker_key  marker zset     emq:{q}:marker (woken: a worker waiting on a limit re-reads
--          it)
-- ARGV[1] version     keyspace version of the caller
-- ARGV[2..] pairs: setting name, non-negative integer value; settings: 'events' (stream
--          cap, 0 = off), 'rate_max' / 'rate_window' (jobs per window ms, 0 = no limit)
-- Returns: 1
-- Errors:  EMQINPUT unknown setting, odd pair list or a value that is not an integer >= 0;
--          EMQVERSION keyspace of another major version
--@include common

local meta_key = KEYS[1]
local marker_key = KEYS[2]
local version = ARGV[1]

local known = {events = true, rate_max = true, rate_window = true}
if #ARGV < 3 or (#ARGV - 1) % 2 ~= 0 then
  return redis.error_reply('EMQINPUT configure needs setting/value pairs')
end
for i = 2, #ARGV, 2 do
  local value = tonumber(ARGV[i + 1])
  if not known[ARGV[i]] or not value or value < 0 or value % 1 ~= 0 then
    return redis.error_reply('EMQINPUT bad setting ' .. tostring(ARGV[i]))
  end
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
for i = 2, #ARGV, 2 do
  redis.call('HSET', meta_key, ARGV[i], ARGV[i + 1])
end
emq_wake(marker_key)
return 1
