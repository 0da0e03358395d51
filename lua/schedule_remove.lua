-- schedule_remove.lua: delete one schedule (its registry entry and record)
-- atomically. Jobs it already minted are ordinary jobs and stay.
--
-- KEYS[1] repeat zset    emq:{q}:repeat
-- KEYS[2] record hash    emq:{q}:repeat:<name>
-- KEYS[3] meta hash      emq:{q}:meta
-- ARGV[1] schedule name
-- ARGV[2] keyspace version of the caller
-- Returns: 1 removed, 0 no such schedule (nothing written)
-- Errors:  EMQINPUT empty name; EMQVERSION keyspace of another major version
--@include common

if ARGV[1] == '' then
  return redis.error_reply('EMQINPUT schedule name must not be empty')
end
if redis.call('EXISTS', KEYS[2]) == 0 and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
local err = emq_fence(KEYS[3], ARGV[2])
if err then return redis.error_reply(err) end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
