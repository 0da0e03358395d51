-- group_free.lua: jobs of these groups just finished (completed, failed, retried): each one
-- leaves its group's count of active jobs (its gactive member, unless its lease is held
-- again: then the member is the new run's), and a group parked at its concurrency cap
-- rejoins the turn order, waking one blocked worker (the marker). Sent by the Workers
-- after their outcomes' writes, so a capped group runs at its cap and claim.lua counts a
-- group's active jobs without re-reading their leases (its prune is only a fallback, for
-- leases that expired). Groups parked by a full rate window, live or absent are left
-- alone. Harmless when re-sent.
--
-- KEYS[1] groups zset    emq:{q}:groups   (ring of ready groups)
-- KEYS[2] meta hash      emq:{q}:meta
-- KEYS[3] marker zset    emq:{q}:marker
-- KEYS[4] gactive zset   emq:{q}:gactive  (lex: "<group>\0<id>" per active job of a capped group)
-- KEYS[5] leases hash    emq:{q}:leases
-- ARGV[1] keyspace version of the caller
-- ARGV[2..] pairs: group name, job id of a finished job (at most 4000 values)
-- Returns: number of groups that rejoined the turn order
-- Errors:  EMQINPUT no pair, an odd count, an empty name or more than 4000 values;
--          EMQVERSION keyspace of another major version
--@include common
--@include groups

if #ARGV < 3 or #ARGV % 2 ~= 1 or #ARGV - 1 > EMQ_MAX_BATCH then
  return redis.error_reply('EMQINPUT group_free needs 1 to ' .. EMQ_MAX_BATCH / 2 ..
    ' group/job id pairs')
end
for i = 2, #ARGV do
  if ARGV[i] == '' then return redis.error_reply('EMQINPUT empty group name or job id') end
end
local err = emq_fence(KEYS[2], ARGV[1])
if err then return redis.error_reply(err) end
-- reads first: which members are done with (no lease), which groups were seen
local gone, groups, seen = {}, {}, {}
for i = 2, #ARGV, 2 do
  local g, id = ARGV[i], ARGV[i + 1]
  if not redis.call('HGET', KEYS[5], id) then gone[#gone + 1] = g .. '\0' .. id end
  if not seen[g] then
    seen[g] = true
    groups[#groups + 1] = g
  end
end
for s = 1, #gone, 4000 do
  redis.call('ZREM', KEYS[4], unpack(gone, s, math.min(s + 3999, #gone)))
end
local freed = 0
for _, g in ipairs(groups) do
  if emq_ring_unpark(KEYS[1], g, true) then freed = freed + 1 end
end
if freed > 0 then emq_wake(KEYS[3]) end
return freed
