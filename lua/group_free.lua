-- group_free.lua: jobs of these groups just finished (completed, failed, retried): each one
-- leaves its group's count of active jobs (its gactive member, unless its lease is held
-- again: then the member is the new run's), and a group parked at its concurrency cap
-- rejoins the turn order, waking one blocked worker (the marker). Sent by the Workers
-- after their outcomes' writes, so a capped group runs at its cap and claim.lua counts a
-- group's active jobs without re-reading their leases (its prune is only a fallback, for
-- leases that expired). Groups parked by a full rate window, live or absent are left
-- alone. Harmless when re-sent.
--
-- KEYS[1] groups_key   groups zset     emq:{q}:groups   (ring of ready groups)
-- KEYS[2] meta_key     meta hash       emq:{q}:meta
-- KEYS[3] marker_key   marker zset     emq:{q}:marker
-- KEYS[4] gactive_key  gactive zset    emq:{q}:gactive  (lex: "<group>\0<id>" per active job of a
--          capped group)
-- KEYS[5] leases_key   leases hash     emq:{q}:leases
-- ARGV[1] version      keyspace version of the caller
-- ARGV[2..] pairs: group name, job id of a finished job (at most 4000 values)
-- Returns: number of groups that rejoined the turn order
-- Errors:  EMQINPUT no pair, an odd count, an empty name or more than 4000 values;
--          EMQVERSION keyspace of another major version
--@include common
--@include groups

local groups_key = KEYS[1]
local meta_key = KEYS[2]
local marker_key = KEYS[3]
local gactive_key = KEYS[4]
local leases_key = KEYS[5]
local version = ARGV[1]

if #ARGV < 3 or #ARGV % 2 ~= 1 or #ARGV - 1 > EMQ_MAX_BATCH then
  return redis.error_reply('EMQINPUT group_free needs 1 to ' .. EMQ_MAX_BATCH / 2 ..
    ' group/job id pairs')
end
for i = 2, #ARGV do
  if ARGV[i] == '' then return redis.error_reply('EMQINPUT empty group name or job id') end
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
-- reads first: which members are done with (no lease), which groups were seen
local gone, groups, seen = {}, {}, {}
for i = 2, #ARGV, 2 do
  local g, id = ARGV[i], ARGV[i + 1]
  if not redis.call('HGET', leases_key, id) then gone[#gone + 1] = g .. '\0' .. id end
  if not seen[g] then
    seen[g] = true
    groups[#groups + 1] = g
  end
end
for s = 1, #gone, 4000 do
  redis.call('ZREM', gactive_key, unpack(gone, s, math.min(s + 3999, #gone)))
end
local freed = 0
for _, g in ipairs(groups) do
  if emq_ring_unpark(groups_key, g, true) then freed = freed + 1 end
end
if freed > 0 then emq_wake(marker_key) end
return freed
