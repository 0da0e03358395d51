-- group_free.lua: jobs of these groups just finished (completed, failed, retried): a group
-- parked at its concurrency cap has a free slot now, so it rejoins the turn order and one
-- blocked worker is woken (the marker). Sent by the Workers after their outcomes' writes,
-- so a capped group runs at its cap instead of waiting for a re-check. Groups parked by a
-- full rate window, live on the ring or absent are left alone. Harmless when re-sent.
--
-- KEYS[1] groups zset    emq:{q}:groups   (ring of ready groups)
-- KEYS[2] meta hash      emq:{q}:meta
-- KEYS[3] marker zset    emq:{q}:marker
-- ARGV[1] keyspace version of the caller
-- ARGV[2..] group names (at most 4000)
-- Returns: number of groups that rejoined the turn order
-- Errors:  EMQINPUT no group, an empty name or more than 4000; EMQVERSION keyspace of another major version
--@include common
--@include groups

if #ARGV < 2 or #ARGV - 1 > EMQ_MAX_BATCH then
  return redis.error_reply('EMQINPUT group_free needs 1 to ' .. EMQ_MAX_BATCH .. ' groups')
end
for i = 2, #ARGV do
  if ARGV[i] == '' then return redis.error_reply('EMQINPUT empty group name') end
end
local err = emq_fence(KEYS[2], ARGV[1])
if err then return redis.error_reply(err) end
local freed = 0
for i = 2, #ARGV do
  if emq_ring_unpark(KEYS[1], ARGV[i], true) then freed = freed + 1 end
end
if freed > 0 then emq_wake(KEYS[3]) end
return freed
