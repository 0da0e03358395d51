-- pause.lua: pause or resume a queue. Paused queues accept jobs but workers
-- claim none; resuming wakes a blocked worker.
--
-- KEYS[1] meta hash      emq:{q}:meta
-- KEYS[2] marker zset    emq:{q}:marker
-- ARGV[1] '1' pause, '0' resume
-- ARGV[2] keyspace version of the caller
-- Returns: 1
-- Errors:  EMQINPUT ARGV[1] neither '1' nor '0'; EMQVERSION keyspace of another major version
--@include common

if ARGV[1] ~= '1' and ARGV[1] ~= '0' then
  return redis.error_reply('EMQINPUT pause needs 1 (pause) or 0 (resume)')
end
local err = emq_fence(KEYS[1], ARGV[2])
if err then return redis.error_reply(err) end
if ARGV[1] == '1' then
  redis.call('HSET', KEYS[1], 'paused', '1')
else
  redis.call('HDEL', KEYS[1], 'paused')
  emq_wake(KEYS[2])
end
return 1
