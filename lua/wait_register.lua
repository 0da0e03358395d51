-- wait_register.lua: register waiters (ref.wait) on jobs of one queue and read their state
-- in the same atomic step. A job that already ended for good is answered at once (nothing
-- registered); a job still to end gets its count in the waiters hash raised, so the finish
-- hook (includes/finished.lua) publishes its outcome on emq:{q}:done:<id> when it ends. The
-- caller SUBSCRIBEs to those channels before this call: an end in between is never missed.
--
-- KEYS[1] waiters_key  waiters hash    emq:{q}:waiters (job id -> registered waiters)
-- KEYS[2] meta_key     meta hash       emq:{q}:meta
-- KEYS[3..] job hashes   emq:{q}:job:<id>, one per id in ARGV[2..], same order
-- ARGV[1] version      keyspace version of the caller
-- ARGV[2..] job ids (at most EMQ_MAX_BATCH)
-- Returns: one entry per job, in order: {state, result, error, traceback} (false for a field
--          not set) for a job that ended for good (completed, failed, cancelled, expired:
--          not registered), or {} for a job registered (still to end)
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts or more than EMQ_MAX_BATCH ids;
--          EMQNOJOB an unknown id (names the first; nothing registered);
--          EMQVERSION keyspace of another major version
--@include common

local waiters_key = KEYS[1]
local meta_key = KEYS[2]
local version = ARGV[1]

local n = #KEYS - 2
if n < 1 or #ARGV ~= n + 1 or n > EMQ_MAX_BATCH then
  return redis.error_reply('EMQINPUT wait_register needs one job key per id, 1 to ' ..
    EMQ_MAX_BATCH .. ' ids')
end
local ENDED = {completed = true, failed = true, cancelled = true, expired = true}
-- every read and check first: an unknown id refuses the whole call before any write
local out, todo = {}, {}
for i = 1, n do
  local f = redis.call('HMGET', KEYS[i + 2], 'state', 'result', 'error', 'traceback')
  if f[1] and ENDED[f[1]] then
    out[i] = f
  elseif redis.call('EXISTS', KEYS[i + 2]) == 0 then
    return redis.error_reply('EMQNOJOB no job ' .. ARGV[i + 1])
  else
    out[i] = {}
    todo[#todo + 1] = ARGV[i + 1]
  end
end
if #todo == 0 then return out end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
for _, id in ipairs(todo) do redis.call('HINCRBY', waiters_key, id, 1) end
return out
