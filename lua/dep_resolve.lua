-- dep_resolve.lua: one dependency of a waiting job ended; resolve it, in the dependent's
-- slot. The dependency leaves the job's deps set (idempotent: a resolve sent
-- again, by a second drainer or the repair, finds it gone and does nothing). The last one
-- gone releases the job to pending with its own pending score (its priority tier and mint
-- order). A dependency that did not complete (failed, cancelled, expired or vanished), for
-- a job with on_dep_failure 'fail', fails the job at once with error 'dependency failed';
-- the finish hook then tells its own waiters and queues it for its own dependents
-- (the cascade). With 'run' such a dependency counts as done.
--
-- KEYS[1] job hash        emq:{q}:job:<id>
-- KEYS[2] deps set        emq:{q}:job:<id>:deps
-- KEYS[3] waitdeps zset   emq:{q}:waitdeps
-- KEYS[4] deplink zset    emq:{q}:deplink
-- KEYS[5] pending zset    emq:{q}:pending
-- KEYS[6] failed zset     emq:{q}:failed
-- KEYS[7] marker zset     emq:{q}:marker
-- KEYS[8] meta hash       emq:{q}:meta
-- KEYS[9] events stream   emq:{q}:events
-- KEYS[10] metrics hash   emq:{q}:metrics
-- KEYS[11] waiters hash   emq:{q}:waiters
-- KEYS[12] dependents     emq:{q}:dependents (hash)
-- KEYS[13] outbox list    emq:{q}:outbox
-- ARGV[1] job id
-- ARGV[2] the dependency, "<queue>\0<job id>"
-- ARGV[3] how it ended: 'completed', 'failed', 'cancelled', 'expired' or 'missing'
-- ARGV[4] keyspace version of the caller
-- Returns: 0 nothing to do (not waiting, or this dependency already resolved); 1 the job
--          was released to pending; 2 the job failed ('dependency failed'); 3 resolved,
--          other dependencies still outstanding
-- Errors:  EMQVERSION keyspace of another major version; NOPERM the ACL denies a command
--          it writes with (before any write)
--@include common
--@include deps
--@include finished

local id = ARGV[1]
if redis.call('HGET', KEYS[1], 'state') ~= 'waiting_deps' then return 0 end
if redis.call('SISMEMBER', KEYS[2], ARGV[2]) == 0 then return 0 end
local fails = ARGV[3] ~= 'completed' and redis.call('HGET', KEYS[1], 'odf') ~= 'run'
local last = redis.call('SCARD', KEYS[2]) == 1
local hook, denied = nil, nil
if fails then hook, denied = emq_finish_prepare(KEYS[11], KEYS[12], KEYS[13]) end
if not denied then
  denied = emq_deps_denied({{'SREM', KEYS[2], 'm'}, {'HSET', KEYS[1], 'f', 'v'},
    {'ZADD', KEYS[5], '0', 'm'}, {'ZADD', KEYS[6], '0', 'm'}, {'ZREM', KEYS[3], 'm'},
    {'HINCRBY', KEYS[10], 'f', '1'}})
end
if denied then return redis.error_reply(denied) end
local cap = emq_events_cap(KEYS[8])
local now = emq_now()
local err = emq_fence(KEYS[8], ARGV[4])
if err then return redis.error_reply(err) end

if fails then
  redis.call('HSET', KEYS[1], 'state', 'failed', 'error', 'dependency failed',
    'finished', emq_int(now))
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZADD', KEYS[6], now, id)
  redis.call('HINCRBY', KEYS[10], 'failed', 1)
  emq_event(KEYS[9], cap, 'failed', 'id', id, 'attempt', '0', 'error', 'dependency failed')
  emq_finished(hook, KEYS[11], KEYS[12], KEYS[13], {id}, 'failed')
  return 2
end
redis.call('SREM', KEYS[2], ARGV[2])
if not last then return 3 end
local ps = redis.call('HGET', KEYS[1], 'ps') or '0'
redis.call('HDEL', KEYS[1], 'state')  -- waiting again: the pending set says where
redis.call('HSET', KEYS[1], 'run_at', emq_int(now))  -- its wait is measured from now
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
redis.call('ZADD', KEYS[5], ps, id)
emq_wake(KEYS[7])
emq_event(KEYS[9], cap, 'ready', 'id', id)
return 1
