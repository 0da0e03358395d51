-- promote.lua: release due delayed jobs to pending, on the server clock. Each
-- job rejoins pending with its original score (priority tier + arrival counter),
-- so released jobs run in mint order within their tier. A parked job's hash holds
-- no state and no run-at (its delayed score has it): the release stamps 'run_at',
-- so the job's wait is measured from when it became due. (The move itself is
-- includes/promote.lua's, shared with promote_many.lua.)
--
-- KEYS[1] delayed_key  delayed zset    emq:{q}:delayed
-- KEYS[2] pending_key  pending zset    emq:{q}:pending
-- KEYS[3] marker_key   marker zset     emq:{q}:marker
-- KEYS[4] meta_key     meta hash       emq:{q}:meta
-- KEYS[5] events_key   events stream   emq:{q}:events
-- KEYS[6..] job hashes   emq:{q}:job:<id>, one per ARGV[2..] id, same order
-- ARGV[1] version      keyspace version of the caller
-- ARGV[2..] job ids (from due.lua; re-checked here, so a stale list is harmless), at most 4000
-- Returns: number of jobs released
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts or more than 4000 ids;
--          EMQVERSION keyspace of another major version
--@include common
--@include promote

local delayed_key = KEYS[1]
local pending_key = KEYS[2]
local marker_key = KEYS[3]
local meta_key = KEYS[4]
local events_key = KEYS[5]
local version = ARGV[1]

if #ARGV < 1 or #ARGV - 1 ~= #KEYS - 5 then
  return redis.error_reply('EMQINPUT promote needs one job key per id')
end
if #ARGV - 1 > EMQ_MAX_BATCH then
  return redis.error_reply('EMQINPUT promote takes at most ' .. EMQ_MAX_BATCH .. ' ids per call')
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local bound = emq_due_bound(emq_now())
local cap = emq_events_cap(meta_key)
return emq_promote_ids(delayed_key, pending_key, marker_key, events_key, cap, bound, 1, 5,
                       #ARGV - 1)
