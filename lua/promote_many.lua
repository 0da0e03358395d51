-- promote_many.lua: promote.lua for many queues of one standalone server in one call (their
-- keys lie in many Cluster slots: on Cluster, promote.lua runs per queue). Each queue's due
-- ids move exactly as promote.lua moves them (includes/promote.lua); what the call saves is
-- the per-queue script dispatch, TIME and meta reads, which dominate when each of thousands
-- of queues has a few due jobs. It takes queues with at most 16 ids each (a queue with more
-- pays per job, not per call: promote.lua), 500 queues and 4000 ids per call at most.
--
-- KEYS[1..] per queue, in ARGV order: its delayed zset (emq:{q}:delayed), pending zset
--          (emq:{q}:pending), marker zset (emq:{q}:marker), meta hash (emq:{q}:meta),
--          events stream (emq:{q}:events), then its job hashes (emq:{q}:job:<id>), one
--          per id, in its ids' order
-- ARGV[1] version  keyspace version of the caller
-- ARGV[2..] per queue: its id count c (integer 1..16), then its c ids (from due_many.lua;
--          re-checked here, so a stale list is harmless)
-- Returns: per queue, in order: number of jobs released
-- Errors:  EMQINPUT a count not an integer in [1, 16], KEYS not 5 + c keys per queue, no
--          queue, more than 500 queues or 4000 ids; EMQVERSION a queue's keyspace of another
--          major version. Each refuses the whole call before any write: one bad queue writes
--          nothing at all, for any queue.
--@include common
--@include promote

local version = ARGV[1]

local MAX_QUEUES, MAX_IDS = 500, EMQ_MAX_BATCH
local queues = {}  -- per queue: {k0 (its keys follow KEYS[k0]), a0 (its count's ARGV index), c}
local a, k, ids = 2, 0, 0
while a <= #ARGV do
  local c = tonumber(ARGV[a])
  if not c or c < 1 or c > EMQ_PROMOTE_FEW or c % 1 ~= 0 or a + c > #ARGV then
    return redis.error_reply('EMQINPUT promote_many: each queue needs a count in [1, ' ..
      EMQ_PROMOTE_FEW .. '] followed by that many ids')
  end
  queues[#queues + 1] = {k, a, c}
  a, k, ids = a + c + 1, k + 5 + c, ids + c
  if #queues > MAX_QUEUES or ids > MAX_IDS then
    return redis.error_reply('EMQINPUT promote_many takes at most ' .. MAX_QUEUES ..
      ' queues and ' .. MAX_IDS .. ' ids per call')
  end
end
if #queues == 0 or k ~= #KEYS then
  return redis.error_reply('EMQINPUT promote_many needs 5 queue keys and one job key per id')
end

-- Every queue's fence and events cap, read before the first write (one HMGET each); the
-- version's own form is checked once, then only a queue stamped with another string
-- than the caller's is compared by major version.
local err = emq_fence_check(false, version)
if err then return redis.error_reply(err) end
local stamp, caps = {}, {}
for i = 1, #queues do
  local k0 = queues[i][1]
  local got = redis.call('HMGET', KEYS[k0 + 4], 'version', 'events')
  local have = got[1]
  if have ~= version then
    err = emq_fence_check(have, version)
    if err then return redis.error_reply(err) end
    stamp[i] = not have
  end
  caps[i] = emq_events_cap_of(got[2])
end

local bound = emq_due_bound(emq_now())
local moved = {}
for i = 1, #queues do
  local k0, a0, c = queues[i][1], queues[i][2], queues[i][3]
  if stamp[i] then redis.call('HSET', KEYS[k0 + 4], 'version', version) end
  moved[i] = emq_promote_ids(KEYS[k0 + 1], KEYS[k0 + 2], KEYS[k0 + 3], KEYS[k0 + 5], caps[i],
    bound, a0, k0 + 5, c)
end
return moved
