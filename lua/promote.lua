-- promote.lua: release due delayed jobs to pending, on the server clock. Each
-- job rejoins pending with its original score (priority tier + arrival counter),
-- so released jobs run in mint order within their tier.
--
-- KEYS[1] delayed zset   emq:{q}:delayed
-- KEYS[2] pending zset   emq:{q}:pending
-- KEYS[3] marker zset    emq:{q}:marker
-- KEYS[4] meta hash      emq:{q}:meta
-- KEYS[5] events stream  emq:{q}:events
-- KEYS[6..] job hashes   emq:{q}:job:<id>, one per ARGV[2..] id, same order
-- ARGV[1] keyspace version of the caller
-- ARGV[2..] job ids (from due.lua; re-checked here, so a stale list is harmless)
-- Returns: number of jobs released
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts; EMQVERSION keyspace of another major version
--@include common

if #ARGV < 1 or #ARGV - 1 ~= #KEYS - 5 then
  return redis.error_reply('EMQINPUT promote needs one job key per id')
end
local err = emq_fence(KEYS[4], ARGV[1])
if err then return redis.error_reply(err) end
local bound = emq_due_bound(emq_now())
local cap = emq_events_cap(KEYS[4])
local moved = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) <= bound then
    redis.call('ZREM', KEYS[1], id)
    local ps = redis.call('HGET', KEYS[i + 4], 'ps')
    if ps then
      redis.call('ZADD', KEYS[2], ps, id)
      redis.call('HSET', KEYS[i + 4], 'state', 'pending')
      emq_event(KEYS[5], cap, 'promoted', 'id', id)
      moved = moved + 1
    end
  end
end
if moved > 0 then emq_wake(KEYS[3]) end
return moved
