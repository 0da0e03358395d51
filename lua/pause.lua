-- pause.lua: pause or resume a queue. Paused queues accept jobs but workers
-- claim none; resuming wakes a blocked worker.
--
-- KEYS[1] meta_key    meta hash       emq:{q}:meta
-- KEYS[2] marker_key  marker zset     emq:{q}:marker
-- ARGV[1] paused      '1' pause, '0' resume
-- ARGV[2] version     keyspace version of the caller
-- Returns: 1
-- Errors:  EMQINPUT ARGV[1] neither '1' nor '0'; EMQVERSION keyspace of another major version
--@include common

local meta_key = KEYS[1]
local marker_key = KEYS[2]
local paused = ARGV[1]
local version = ARGV[2]

if paused ~= '1' and paused ~= '0' then
  return redis.error_reply('EMQINPUT pause needs 1 (pause) or 0 (resume)')
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
if paused == '1' then
  redis.call('HSET', meta_key, 'paused', '1')
else
  redis.call('HDEL', meta_key, 'paused')
  emq_wake(marker_key)
end
return 1
