-- promote_one.lua: make one waiting job of the delayed set (scheduled, a retry waiting out
-- its backoff, or parked by a rate window) due now: it moves to pending, or its group lane,
-- exactly as promote.lua moves a due job: with its pending score (priority tier + arrival
-- counter, so it keeps its place in its tier) and a 'run_at' stamp (now: its wait is
-- measured from when it became due). The dashboard's "Promote now".
--
-- KEYS[1] job_key      job hash        emq:{q}:job:<id>
-- KEYS[2] delayed_key  delayed zset    emq:{q}:delayed
-- KEYS[3] pending_key  pending zset    emq:{q}:pending (or the job's group lane
--          emq:{q}:g:<group>:pending)
-- KEYS[4] marker_key   marker zset     emq:{q}:marker
-- KEYS[5] meta_key     meta hash       emq:{q}:meta
-- KEYS[6] events_key   events stream   emq:{q}:events
-- ARGV[1] id           job id
-- ARGV[2] version      keyspace version of the caller
-- ARGV[3] group        the job's group as the caller read it ('' for none): KEYS[3] is its lane
-- Returns: 1
-- Errors:  EMQNOJOB unknown id; EMQSTATE the job is not on the delayed set (or has no
--          pending score); EMQINPUT ARGV[3] is not the job's group (KEYS[3] the wrong set);
--          EMQVERSION keyspace of another major version
--@include common

local job_key = KEYS[1]
local delayed_key = KEYS[2]
local pending_key = KEYS[3]
local marker_key = KEYS[4]
local meta_key = KEYS[5]
local events_key = KEYS[6]
local id = ARGV[1]
local version = ARGV[2]
local group = ARGV[3]

-- every check before the first write: a refused call writes nothing
if redis.call('EXISTS', job_key) == 0 then
  return redis.error_reply('EMQNOJOB no job ' .. id)
end
if not redis.call('ZSCORE', delayed_key, id) then
  return redis.error_reply('EMQSTATE job ' .. id .. ' is not waiting on the delayed set')
end
if (redis.call('HGET', job_key, 'group') or '') ~= group then
  return redis.error_reply('EMQINPUT job ' .. id .. ' is not in group ' .. group)
end
local ps = redis.call('HGET', job_key, 'ps')
if not ps then
  return redis.error_reply('EMQSTATE job ' .. id .. ' has no pending score')
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local now = emq_now()
redis.call('ZREM', delayed_key, id)
redis.call('HSET', job_key, 'run_at', now)
redis.call('ZADD', pending_key, ps, id)
emq_wake(marker_key)
emq_event(events_key, emq_events_cap(meta_key), 'promoted', 'id', id)
return 1
