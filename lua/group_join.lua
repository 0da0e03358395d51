-- group_join.lua: put groups on the ring of ready groups (at the back, unless already
-- on it). Sent just before a move that returns grouped jobs to their lanes (promote,
-- reap, retry with a lane as their pending set), so no lane is ever left off the ring;
-- a group whose lane turns out empty is dropped by the next claim.
--
-- KEYS[1] groups_key  groups zset     emq:{q}:groups   (ring of ready groups)
-- KEYS[2] meta_key    meta hash       emq:{q}:meta
-- ARGV[1] version     keyspace version of the caller
-- ARGV[2..] group names
-- Returns: number of groups that joined (were not on the ring)
-- Errors:  EMQINPUT no group or an empty name; EMQVERSION keyspace of another major version
--@include common
--@include groups

local groups_key = KEYS[1]
local meta_key = KEYS[2]
local version = ARGV[1]

if #ARGV < 2 then
  return redis.error_reply('EMQINPUT group_join needs at least one group')
end
for i = 2, #ARGV do
  if ARGV[i] == '' then return redis.error_reply('EMQINPUT empty group name') end
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local joined = 0
for i = 2, #ARGV do
  if not redis.call('ZSCORE', groups_key, ARGV[i]) then
    emq_ring_back(groups_key, ARGV[i], false)
    joined = joined + 1
  else
    -- parked (cap reached, window full): jobs moving back may mean a slot freed, re-check
    emq_ring_unpark(groups_key, ARGV[i])
  end
end
return joined
