-- group_limit.lua: set or clear one group's concurrency cap (how many of its jobs may
-- be active at once across all workers; enforced by claim.lua).
--
-- KEYS[1] glimit hash    emq:{q}:glimit   (group -> cap)
-- KEYS[2] meta hash      emq:{q}:meta
-- KEYS[3] marker zset    emq:{q}:marker   (woken: a raised cap may admit waiting jobs)
-- KEYS[4] groups zset    emq:{q}:groups   (optional: the group, if parked, rejoins the turn order)
-- ARGV[1] keyspace version of the caller
-- ARGV[2] group name
-- ARGV[3] cap, integer >= 1, or 0 to remove the cap
-- Returns: 1
-- Errors:  EMQINPUT empty group or a cap that is not an integer >= 0;
--          EMQVERSION keyspace of another major version
--@include common
--@include groups

local cap = tonumber(ARGV[3])
if not ARGV[2] or ARGV[2] == '' or not cap or cap < 0 or cap % 1 ~= 0 then
  return redis.error_reply('EMQINPUT group_limit needs a group and an integer cap >= 0')
end
local err = emq_fence(KEYS[2], ARGV[1])
if err then return redis.error_reply(err) end
if cap == 0 then
  redis.call('HDEL', KEYS[1], ARGV[2])
else
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
end
-- a parked group is re-checked under its new settings at once
if KEYS[4] then emq_ring_unpark(KEYS[4], ARGV[2], false) end
emq_wake(KEYS[3])
return 1
