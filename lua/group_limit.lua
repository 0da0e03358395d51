-- group_limit.lua: set or clear one group's concurrency cap (how many of its jobs may
-- be active at once across all workers; enforced by claim.lua).
--
-- KEYS[1] glimit_key  glimit hash     emq:{q}:glimit   (group -> cap)
-- KEYS[2] meta_key    meta hash       emq:{q}:meta
-- KEYS[3] marker_key  marker zset     emq:{q}:marker   (woken: a raised cap may admit waiting jobs)
-- KEYS[4] groups_key  groups zset     emq:{q}:groups   (optional: the group, if parked, rejoins
--          the turn order)
-- ARGV[1] version     keyspace version of the caller
-- ARGV[2] group       group name
-- ARGV[3] cap_arg     cap, integer >= 1, or 0 to remove the cap
-- Returns: 1
-- Errors:  EMQINPUT empty group or a cap that is not an integer >= 0;
--          EMQVERSION keyspace of another major version
--@include common
--@include groups

local glimit_key = KEYS[1]
local meta_key = KEYS[2]
local marker_key = KEYS[3]
local groups_key = KEYS[4]
local version = ARGV[1]
local group = ARGV[2]
local cap_arg = ARGV[3]

local cap = tonumber(cap_arg)
if not group or group == '' or not cap or cap < 0 or cap % 1 ~= 0 then
  return redis.error_reply('EMQINPUT group_limit needs a group and an integer cap >= 0')
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
if cap == 0 then
  redis.call('HDEL', glimit_key, group)
else
  redis.call('HSET', glimit_key, group, cap_arg)
end
-- a parked group is re-checked under its new settings at once
if groups_key then emq_ring_unpark(groups_key, group, false) end
emq_wake(marker_key)
return 1
