-- delete.lua: delete one job that is not active: its hash and its membership in whichever
-- set holds it (pending or its group lane, delayed, completed, failed, cancelled, expired,
-- waiting for its dependencies: with its set of them). Jobs that depend on it see it as
-- not completed (the dependency sweep, facade/dep_settle.py). An active
-- job is refused: its handler owns it until it ends (cancel or wait first). The dashboard's
-- "Delete".
--
-- KEYS[1] job hash        emq:{q}:job:<id>
-- KEYS[2] pending zset    emq:{q}:pending (or the job's group lane emq:{q}:g:<group>:pending)
-- KEYS[3] delayed zset    emq:{q}:delayed
-- KEYS[4] completed zset  emq:{q}:completed
-- KEYS[5] failed zset     emq:{q}:failed
-- KEYS[6] cancelled zset  emq:{q}:cancelled
-- KEYS[7] active zset     emq:{q}:active
-- KEYS[8] meta hash       emq:{q}:meta
-- KEYS[9] events stream   emq:{q}:events
-- KEYS[10] waitdeps zset  emq:{q}:waitdeps
-- KEYS[11] deplink zset   emq:{q}:deplink
-- KEYS[12] expired zset   emq:{q}:expired
-- KEYS[13] deps set       emq:{q}:job:<id>:deps
-- KEYS[14] waiters hash   emq:{q}:waiters (ref.wait: told 'deleted', it raises JobNotFound)
-- KEYS[15] dependents     emq:{q}:dependents (hash; its dependents see it as not completed)
-- KEYS[16] outbox list    emq:{q}:outbox ("deleted\0<id>" for a job with dependents)
-- ARGV[1] job id
-- ARGV[2] keyspace version of the caller
-- ARGV[3] the job's group as the caller read it ('' for none): KEYS[2] is its lane
-- Returns: 1
-- Errors:  EMQNOJOB unknown id; EMQSTATE the job is active (leased to a worker);
--          EMQINPUT ARGV[3] is not the job's group (KEYS[2] the wrong set);
--          EMQVERSION keyspace of another major version; NOPERM the ACL denies what the
--          finish hook needs (7.0+: before any write)
--@include common
--@include finished

-- every check before the first write: a refused call writes nothing
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('EMQNOJOB no job ' .. ARGV[1])
end
if redis.call('ZSCORE', KEYS[7], ARGV[1]) then
  return redis.error_reply('EMQSTATE job ' .. ARGV[1] .. ' is active')
end
if (redis.call('HGET', KEYS[1], 'group') or '') ~= ARGV[3] then
  return redis.error_reply('EMQINPUT job ' .. ARGV[1] .. ' is not in group ' .. ARGV[3])
end
local hook, denied = emq_finish_prepare(KEYS[14], KEYS[15], KEYS[16])
if denied then return redis.error_reply(denied) end
local err = emq_fence(KEYS[8], ARGV[2])
if err then return redis.error_reply(err) end
for i = 2, 6 do redis.call('ZREM', KEYS[i], ARGV[1]) end
for i = 10, 12 do redis.call('ZREM', KEYS[i], ARGV[1]) end
redis.call('DEL', KEYS[1], KEYS[13])
emq_event(KEYS[9], emq_events_cap(KEYS[8]), 'deleted', 'id', ARGV[1])
emq_finished(hook, KEYS[14], KEYS[15], KEYS[16], {ARGV[1]}, 'deleted')
return 1
