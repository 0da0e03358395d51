-- delete.lua: delete one job that is not active: its hash and its membership in whichever
-- set holds it (pending or its group lane, delayed, completed, failed, cancelled, expired,
-- waiting for its dependencies: with its set of them). Jobs that depend on it see it as
-- not completed (the dependency sweep, facade/dep_settle.py). An active
-- job is refused: its handler owns it until it ends (cancel or wait first). The dashboard's
-- "Delete".
--
-- KEYS[1] job_key          job hash        emq:{q}:job:<id>
-- KEYS[2] pending_key      pending zset    emq:{q}:pending (or the job's group lane
--          emq:{q}:g:<group>:pending)
-- KEYS[3] delayed_key      delayed zset    emq:{q}:delayed
-- KEYS[4] completed_key    completed zset  emq:{q}:completed
-- KEYS[5] failed_key       failed zset     emq:{q}:failed
-- KEYS[6] cancelled_key    cancelled zset  emq:{q}:cancelled
-- KEYS[7] active_key       active zset     emq:{q}:active
-- KEYS[8] meta_key         meta hash       emq:{q}:meta
-- KEYS[9] events_key       events stream   emq:{q}:events
-- KEYS[10] waitdeps_key    waitdeps zset   emq:{q}:waitdeps
-- KEYS[11] deplink_key     deplink zset    emq:{q}:deplink
-- KEYS[12] expired_key     expired zset    emq:{q}:expired
-- KEYS[13] deps_key        deps set        emq:{q}:job:<id>:deps
-- KEYS[14] waiters_key     waiters hash    emq:{q}:waiters (ref.wait: told 'deleted', it raises
--          JobNotFound)
-- KEYS[15] dependents_key  dependents      emq:{q}:dependents (hash; its dependents see it as not
--          completed)
-- KEYS[16] outbox_key      outbox list     emq:{q}:outbox ("deleted\0<id>" for a job with
--          dependents)
-- ARGV[1] id               job id
-- ARGV[2] version          keyspace version of the caller
-- ARGV[3] group            the job's group as the caller read it ('' for none): KEYS[2] is its lane
-- Returns: 1
-- Errors:  EMQNOJOB unknown id; EMQSTATE the job is active (leased to a worker);
--          EMQINPUT ARGV[3] is not the job's group (KEYS[2] the wrong set);
--          EMQVERSION keyspace of another major version; NOPERM the ACL denies what the
--          finish hook needs (7.0+: before any write)
--@include common
--@include finished

local job_key = KEYS[1]
local pending_key = KEYS[2]
local delayed_key = KEYS[3]
local completed_key = KEYS[4]
local failed_key = KEYS[5]
local cancelled_key = KEYS[6]
local active_key = KEYS[7]
local meta_key = KEYS[8]
local events_key = KEYS[9]
local waitdeps_key = KEYS[10]
local deplink_key = KEYS[11]
local expired_key = KEYS[12]
local deps_key = KEYS[13]
local waiters_key = KEYS[14]
local dependents_key = KEYS[15]
local outbox_key = KEYS[16]
local id = ARGV[1]
local version = ARGV[2]
local group = ARGV[3]

-- every check before the first write: a refused call writes nothing
if redis.call('EXISTS', job_key) == 0 then
  return redis.error_reply('EMQNOJOB no job ' .. id)
end
if redis.call('ZSCORE', active_key, id) then
  return redis.error_reply('EMQSTATE job ' .. id .. ' is active')
end
if (redis.call('HGET', job_key, 'group') or '') ~= group then
  return redis.error_reply('EMQINPUT job ' .. id .. ' is not in group ' .. group)
end
local hook, denied = emq_finish_prepare(waiters_key, dependents_key, outbox_key)
if denied then return redis.error_reply(denied) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
redis.call('ZREM', pending_key, id)
redis.call('ZREM', delayed_key, id)
redis.call('ZREM', completed_key, id)
redis.call('ZREM', failed_key, id)
redis.call('ZREM', cancelled_key, id)
redis.call('ZREM', waitdeps_key, id)
redis.call('ZREM', deplink_key, id)
redis.call('ZREM', expired_key, id)
redis.call('DEL', job_key, deps_key)
emq_event(events_key, emq_events_cap(meta_key), 'deleted', 'id', id)
emq_finished(hook, waiters_key, dependents_key, outbox_key, {id}, 'deleted')
return 1
