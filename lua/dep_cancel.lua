-- dep_cancel.lua: cancel a job waiting for its dependencies (state waiting_deps), in its
-- slot. It leaves waitdeps (and deplink), its deps set goes, and it keeps a
-- record like any cancelled job (state cancelled, `finished`, the cancelled zset); its
-- waiters and its own dependents are told through the finish hook (outcome cancelled).
-- Links to it left in its dependencies' slots are harmless: a resolve finds it no longer
-- waiting and does nothing.
--
-- KEYS[1] job hash        emq:{q}:job:<id>
-- KEYS[2] deps set        emq:{q}:job:<id>:deps
-- KEYS[3] waitdeps zset   emq:{q}:waitdeps
-- KEYS[4] deplink zset    emq:{q}:deplink
-- KEYS[5] cancelled zset  emq:{q}:cancelled
-- KEYS[6] meta hash       emq:{q}:meta
-- KEYS[7] events stream   emq:{q}:events
-- KEYS[8] waiters hash    emq:{q}:waiters
-- KEYS[9] dependents      emq:{q}:dependents (hash)
-- KEYS[10] outbox list    emq:{q}:outbox
-- ARGV[1] job id
-- ARGV[2] keyspace version of the caller
-- Returns: 1 cancelled; 0 the job is not waiting for dependencies (nothing written)
-- Errors:  EMQVERSION keyspace of another major version; NOPERM the ACL denies a command
--          it writes with (before any write)
--@include common
--@include deps
--@include finished

local id = ARGV[1]
if not redis.call('ZSCORE', KEYS[3], id) then return 0 end
local hook, denied = emq_finish_prepare(KEYS[8], KEYS[9], KEYS[10])
if not denied then
  denied = emq_deps_denied({{'HSET', KEYS[1], 'f', 'v'}, {'ZADD', KEYS[5], '0', 'm'},
    {'ZREM', KEYS[3], 'm'}, {'DEL', KEYS[2]}})
end
if denied then return redis.error_reply(denied) end
local cap = emq_events_cap(KEYS[6])
local now = emq_now()
local err = emq_fence(KEYS[6], ARGV[2])
if err then return redis.error_reply(err) end
redis.call('ZREM', KEYS[3], id)
redis.call('ZREM', KEYS[4], id)
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'state', 'cancelled', 'finished', emq_int(now))
redis.call('ZADD', KEYS[5], now, id)
emq_event(KEYS[7], cap, 'cancelled', 'id', id)
emq_finished(hook, KEYS[8], KEYS[9], KEYS[10], {id}, 'cancelled')
return 1
