-- wait_unregister.lua: take back waiters (ref.wait) that gave up (timed out, or their
-- process is leaving): each id's count in the waiters hash drops by one and its entry goes
-- at 0. An id without an entry (its job ended: the finish hook took the entry when it
-- published) is left alone, so a late or re-sent call never makes a count negative.
--
-- KEYS[1] waiters_key  waiters hash    emq:{q}:waiters (job id -> registered waiters)
-- KEYS[2] meta_key     meta hash       emq:{q}:meta
-- ARGV[1] version      keyspace version of the caller
-- ARGV[2..] job ids, one per waiter given up (at most EMQ_MAX_BATCH)
-- Returns: how many counts were dropped
-- Errors:  EMQINPUT no ids, or more than EMQ_MAX_BATCH; EMQVERSION keyspace of another
--          major version
--@include common

local waiters_key = KEYS[1]
local meta_key = KEYS[2]
local version = ARGV[1]

if #ARGV < 2 or #ARGV > EMQ_MAX_BATCH + 1 then
  return redis.error_reply('EMQINPUT wait_unregister takes 1 to ' .. EMQ_MAX_BATCH .. ' ids')
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local dropped = 0
for a = 2, #ARGV do
  local id = ARGV[a]
  if redis.call('HEXISTS', waiters_key, id) == 1 then
    if redis.call('HINCRBY', waiters_key, id, -1) <= 0 then redis.call('HDEL', waiters_key, id) end
    dropped = dropped + 1
  end
end
return dropped
