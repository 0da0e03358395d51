-- dep_resolve.lua: one dependency of a waiting job ended; resolve it, in the dependent's
-- slot. The dependency leaves the job's deps set (idempotent: a resolve sent
-- again, by a second drainer or the repair, finds it gone and does nothing). The last one
-- gone releases the job to pending with its own pending score (its priority tier and mint
-- order). A dependency that did not complete (failed, cancelled, expired or vanished), for
-- a job with on_dep_failure 'fail', fails the job at once with error 'dependency failed'
-- (naming the culprit in fields 'dep_failed' "<queue>\0<job id>" and 'dep_outcome');
-- the finish hook then tells its own waiters and queues it for its own dependents
-- (the cascade). With 'run' such a dependency counts as done. A completed dependency's
-- result, when the caller sends it, is copied into the job's hash (field
-- 'dr:<queue>\0<job id>'), so the job reads it at its start however soon the dependency's
-- own record is trimmed by retention.
--
-- KEYS[1] job_key          job hash        emq:{q}:job:<id>
-- KEYS[2] deps_key         deps set        emq:{q}:job:<id>:deps
-- KEYS[3] waitdeps_key     waitdeps zset   emq:{q}:waitdeps
-- KEYS[4] deplink_key      deplink zset    emq:{q}:deplink
-- KEYS[5] pending_key      pending zset    emq:{q}:pending
-- KEYS[6] failed_key       failed zset     emq:{q}:failed
-- KEYS[7] marker_key       marker zset     emq:{q}:marker
-- KEYS[8] meta_key         meta hash       emq:{q}:meta
-- KEYS[9] events_key       events stream   emq:{q}:events
-- KEYS[10] metrics_key     metrics hash    emq:{q}:metrics
-- KEYS[11] waiters_key     waiters hash    emq:{q}:waiters
-- KEYS[12] dependents_key  dependents      emq:{q}:dependents (hash)
-- KEYS[13] outbox_key      outbox list     emq:{q}:outbox
-- ARGV[1] id               job id
-- ARGV[2] dependency       the dependency, "<queue>\0<job id>"
-- ARGV[3] outcome          how it ended: 'completed', 'failed', 'cancelled', 'expired' or 'missing'
-- ARGV[4] version          keyspace version of the caller
-- ARGV[5..] optional:
--   ARGV[5] result  the completed dependency's result, as its hash stores it
-- Returns: 0 nothing to do (not waiting, or this dependency already resolved); 1 the job
--          was released to pending; 2 the job failed ('dependency failed'); 3 resolved,
--          other dependencies still outstanding
-- Errors:  EMQVERSION keyspace of another major version; NOPERM the ACL denies a command
--          it writes with (before any write)
--@include common
--@include deps
--@include finished

local job_key = KEYS[1]
local deps_key = KEYS[2]
local waitdeps_key = KEYS[3]
local deplink_key = KEYS[4]
local pending_key = KEYS[5]
local failed_key = KEYS[6]
local marker_key = KEYS[7]
local meta_key = KEYS[8]
local events_key = KEYS[9]
local metrics_key = KEYS[10]
local waiters_key = KEYS[11]
local dependents_key = KEYS[12]
local outbox_key = KEYS[13]
local id = ARGV[1]
local dependency = ARGV[2]
local outcome = ARGV[3]
local version = ARGV[4]
local result = ARGV[5]

if redis.call('HGET', job_key, 'state') ~= 'waiting_deps' then return 0 end
if redis.call('SISMEMBER', deps_key, dependency) == 0 then return 0 end
local fails = outcome ~= 'completed' and redis.call('HGET', job_key, 'odf') ~= 'run'
local last = redis.call('SCARD', deps_key) == 1
local hook, denied = nil, nil
if fails then hook, denied = emq_finish_prepare(waiters_key, dependents_key, outbox_key) end
if not denied then
  denied = emq_deps_denied({{'SREM', deps_key, 'm'}, {'HSET', job_key, 'f', 'v'},
    {'ZADD', pending_key, '0', 'm'}, {'ZADD', failed_key, '0', 'm'}, {'ZREM', waitdeps_key, 'm'},
    {'HINCRBY', metrics_key, 'f', '1'}})
end
if denied then return redis.error_reply(denied) end
local cap = emq_events_cap(meta_key)
local now = emq_now()
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end

if fails then
  redis.call('HSET', job_key, 'state', 'failed', 'error', 'dependency failed',
    'finished', emq_int(now), 'dep_failed', dependency, 'dep_outcome', outcome)
  redis.call('DEL', deps_key)
  redis.call('ZREM', waitdeps_key, id)
  redis.call('ZREM', deplink_key, id)
  redis.call('ZADD', failed_key, now, id)
  redis.call('HINCRBY', metrics_key, 'failed', 1)
  emq_event(events_key, cap, 'failed', 'id', id, 'attempt', '0', 'error', 'dependency failed')
  emq_finished(hook, waiters_key, dependents_key, outbox_key, {id}, 'failed')
  return 2
end
redis.call('SREM', deps_key, dependency)
if result and outcome == 'completed' then
  redis.call('HSET', job_key, 'dr:' .. dependency, result)
end
if not last then return 3 end
local ps = redis.call('HGET', job_key, 'ps') or '0'
redis.call('HDEL', job_key, 'state')  -- waiting again: the pending set says where
redis.call('HSET', job_key, 'run_at', emq_int(now))  -- its wait is measured from now
redis.call('ZREM', waitdeps_key, id)
redis.call('ZREM', deplink_key, id)
redis.call('ZADD', pending_key, ps, id)
emq_wake(marker_key)
emq_event(events_key, cap, 'ready', 'id', id)
return 1
