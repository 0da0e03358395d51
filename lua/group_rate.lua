-- group_rate.lua: set or clear one group's rate limit (at most max jobs of the group
-- claimed in any sliding window of window ms on the server clock; enforced by claim.lua).
--
-- KEYS[1] grate_key   grate hash      emq:{q}:grate    (group -> "max:window")
-- KEYS[2] meta_key    meta hash       emq:{q}:meta
-- KEYS[3] marker_key  marker zset     emq:{q}:marker   (woken: a worker waiting on the window
--          re-reads it)
-- KEYS[4] groups_key  groups zset     emq:{q}:groups   (optional: the group, if parked, rejoins
--          the turn order)
-- ARGV[1] version     keyspace version of the caller
-- ARGV[2] group       group name
-- ARGV[3] max_arg     max jobs per window, integer >= 1, or 0 to remove the limit
-- ARGV[4] window_arg  window ms, integer >= 1 (ignored when ARGV[3] is 0)
-- Returns: 1
-- Errors:  EMQINPUT empty group, or a max / window that is not an integer in range;
--          EMQVERSION keyspace of another major version
--@include common
--@include groups

local grate_key = KEYS[1]
local meta_key = KEYS[2]
local marker_key = KEYS[3]
local groups_key = KEYS[4]
local version = ARGV[1]
local group = ARGV[2]
local max_arg = ARGV[3]
local window_arg = ARGV[4]

local max, window = tonumber(max_arg), tonumber(window_arg)
if not group or group == '' or not max or max < 0 or max % 1 ~= 0
    or not window or window < 0 or window % 1 ~= 0 or (max > 0 and window < 1) then
  return redis.error_reply('EMQINPUT group_rate needs a group, an integer max >= 0 ' ..
    'and an integer window >= 1 ms')
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
if max == 0 then
  redis.call('HDEL', grate_key, group)
else
  redis.call('HSET', grate_key, group, emq_int(max) .. ':' .. emq_int(window))
end
-- a parked group is re-checked under its new settings at once
if groups_key then emq_ring_unpark(groups_key, group, false) end
emq_wake(marker_key)
return 1
