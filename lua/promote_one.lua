-- promote_one.lua: make one waiting job of the delayed set (scheduled, a retry waiting out
-- its backoff, or parked by a rate window) due now: it moves to pending, or its group lane,
-- exactly as promote.lua moves a due job: with its pending score (priority tier + arrival
-- counter, so it keeps its place in its tier) and a 'run_at' stamp (now: its wait is
-- measured from when it became due). The dashboard's "Promote now".
--
-- KEYS[1] job hash        emq:{q}:job:<id>
-- KEYS[2] delayed zset    emq:{q}:delayed
-- KEYS[3] pending zset    emq:{q}:pending (or the job's group lane emq:{q}:g:<group>:pending)
-- KEYS[4] marker zset     emq:{q}:marker
-- KEYS[5] meta hash       emq:{q}:meta
-- KEYS[6] events stream   emq:{q}:events
-- ARGV[1] job id
-- ARGV[2] keyspace version of the caller
-- ARGV[3] the job's group as the caller read it ('' for none): KEYS[3] is its lane
-- Returns: 1
-- Errors:  EMQNOJOB unknown id; EMQSTATE the job is not on the delayed set (or has no
--          pending score); EMQINPUT ARGV[3] is not the job's group (KEYS[3] the wrong set);
--          EMQVERSION keyspace of another major version
--@include common

-- every check before the first write: a refused call writes nothing
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('EMQNOJOB no job ' .. ARGV[1])
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return redis.error_reply('EMQSTATE job ' .. ARGV[1] .. ' is not waiting on the delayed set')
end
if (redis.call('HGET', KEYS[1], 'group') or '') ~= ARGV[3] then
  return redis.error_reply('EMQINPUT job ' .. ARGV[1] .. ' is not in group ' .. ARGV[3])
end
local ps = redis.call('HGET', KEYS[1], 'ps')
if not ps then
  return redis.error_reply('EMQSTATE job ' .. ARGV[1] .. ' has no pending score')
end
local err = emq_fence(KEYS[5], ARGV[2])
if err then return redis.error_reply(err) end
local now = emq_now()
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'run_at', now)
redis.call('ZADD', KEYS[3], ps, ARGV[1])
emq_wake(KEYS[4])
emq_event(KEYS[6], emq_events_cap(KEYS[5]), 'promoted', 'id', ARGV[1])
return 1
