-- group_rate.lua: set or clear one group's rate limit (at most max jobs of the group
-- claimed in any sliding window of window ms on the server clock; enforced by claim.lua).
--
-- KEYS[1] grate hash     emq:{q}:grate    (group -> "max:window")
-- KEYS[2] meta hash      emq:{q}:meta
-- KEYS[3] marker zset    emq:{q}:marker   (woken: a worker waiting on the window re-reads it)
-- KEYS[4] groups zset    emq:{q}:groups   (optional: the group, if parked, rejoins the turn order)
-- ARGV[1] keyspace version of the caller
-- ARGV[2] group name
-- ARGV[3] max jobs per window, integer >= 1, or 0 to remove the limit
-- ARGV[4] window ms, integer >= 1 (ignored when ARGV[3] is 0)
-- Returns: 1
-- Errors:  EMQINPUT empty group, or a max / window that is not an integer in range;
--          EMQVERSION keyspace of another major version
--@include common
--@include groups

local max, window = tonumber(ARGV[3]), tonumber(ARGV[4])
if not ARGV[2] or ARGV[2] == '' or not max or max < 0 or max % 1 ~= 0
    or not window or window < 0 or window % 1 ~= 0 or (max > 0 and window < 1) then
  return redis.error_reply('EMQINPUT group_rate needs a group, an integer max >= 0 ' ..
    'and an integer window >= 1 ms')
end
local err = emq_fence(KEYS[2], ARGV[1])
if err then return redis.error_reply(err) end
if max == 0 then
  redis.call('HDEL', KEYS[1], ARGV[2])
else
  redis.call('HSET', KEYS[1], ARGV[2], emq_int(max) .. ':' .. emq_int(window))
end
-- a parked group is re-checked under its new settings at once
if KEYS[4] then emq_ring_unpark(KEYS[4], ARGV[2], false) end
emq_wake(KEYS[3])
return 1
