-- dep_sweep.lua: the safety net of dependencies. Jobs listed on the dependents
-- hash still owe their dependents a word; the finish hook gives it when they end. A job
-- that ended by a path without the hook (a move that ends jobs but does not call it, a
-- deleted or trimmed job) would leave its dependents waiting for good: this finds such jobs
-- among the ids the caller read from the hash (HSCAN) and queues "<outcome>\0<id>" on the
-- outbox for them, as the hook would have (outcome 'missing' for a job whose hash is gone).
-- Atomic with the hook (one slot): an id the hook took already has no entry here.
--
-- KEYS[1] dependents_key  dependents hash emq:{q}:dependents
-- KEYS[2] outbox_key      outbox list     emq:{q}:outbox
-- KEYS[3] meta_key        meta hash       emq:{q}:meta
-- KEYS[4..] job hashes     emq:{q}:job:<id>, one per ARGV[2..] id, same order
-- ARGV[1] version         keyspace version of the caller
-- ARGV[2..] job ids read from the dependents hash, at most 1000
-- Returns: how many ids were queued on the outbox
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts or more than 1000 ids; EMQVERSION keyspace
--          of another major version; NOPERM the ACL denies HDEL or RPUSH (before any write)
--@include common
--@include deps

local dependents_key = KEYS[1]
local outbox_key = KEYS[2]
local meta_key = KEYS[3]
local version = ARGV[1]

if #ARGV < 2 or #ARGV - 1 ~= #KEYS - 3 or #ARGV - 1 > 1000 then
  return redis.error_reply('EMQINPUT dep_sweep takes 1 to 1000 ids, one job key each')
end
local ended, entries = {}, {}
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('HEXISTS', dependents_key, id) == 1 then
    local state = 'missing'
    if redis.call('EXISTS', KEYS[i + 2]) == 1 then
      state = redis.call('HGET', KEYS[i + 2], 'state')
    end
    if state and (state == 'missing' or EMQ_ENDED[state]) then
      ended[#ended + 1] = id
      entries[#entries + 1] = state .. '\0' .. id
    end
  end
end
if #ended == 0 then return 0 end
local denied = emq_deps_denied({{'HDEL', dependents_key, 'f'}, {'RPUSH', outbox_key, 'x'}})
if denied then return redis.error_reply(denied) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
for s = 1, #ended, 500 do  -- chunked: Lua's unpack() has a stack limit
  local e = math.min(s + 499, #ended)
  redis.call('HDEL', dependents_key, unpack(ended, s, e))
  redis.call('RPUSH', outbox_key, unpack(entries, s, e))
end
return #ended
