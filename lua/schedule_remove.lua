-- schedule_remove.lua: delete one schedule (its registry entry and record)
-- atomically. Jobs it already minted are ordinary jobs and stay.
--
-- KEYS[1] repeat_key  repeat zset     emq:{q}:repeat
-- KEYS[2] record_key  record hash     emq:{q}:repeat:<name>
-- KEYS[3] meta_key    meta hash       emq:{q}:meta
-- ARGV[1] name        schedule name
-- ARGV[2] version     keyspace version of the caller
-- Returns: 1 removed, 0 no such schedule (nothing written)
-- Errors:  EMQINPUT empty name; EMQVERSION keyspace of another major version
--@include common

local repeat_key = KEYS[1]
local record_key = KEYS[2]
local meta_key = KEYS[3]
local name = ARGV[1]
local version = ARGV[2]

if name == '' then
  return redis.error_reply('EMQINPUT schedule name must not be empty')
end
if redis.call('EXISTS', record_key) == 0 and not redis.call('ZSCORE', repeat_key, name) then
  return 0
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
redis.call('ZREM', repeat_key, name)
redis.call('DEL', record_key)
return 1
