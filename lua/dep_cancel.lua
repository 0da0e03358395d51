-- dep_cancel.lua: cancel a job waiting for its dependencies (state waiting_deps), in its
-- slot. It leaves waitdeps (and deplink), its deps set goes, and it keeps a
-- record like any cancelled job (state cancelled, `finished`, the cancelled zset); its
-- waiters and its own dependents are told through the finish hook (outcome cancelled).
-- Links to it left in its dependencies' slots are harmless: a resolve finds it no longer
-- waiting and does nothing.
--
-- KEYS[1] job_key         job hash        emq:{q}:job:<id>
-- KEYS[2] deps_key        deps set        emq:{q}:job:<id>:deps
-- KEYS[3] waitdeps_key    waitdeps zset   emq:{q}:waitdeps
-- KEYS[4] deplink_key     deplink zset    emq:{q}:deplink
-- KEYS[5] cancelled_key   cancelled zset  emq:{q}:cancelled
-- KEYS[6] meta_key        meta hash       emq:{q}:meta
-- KEYS[7] events_key      events stream   emq:{q}:events
-- KEYS[8] waiters_key     waiters hash    emq:{q}:waiters
-- KEYS[9] dependents_key  dependents      emq:{q}:dependents (hash)
-- KEYS[10] outbox_key     outbox list     emq:{q}:outbox
-- ARGV[1] id              job id
-- ARGV[2] version         keyspace version of the caller
-- Returns: 1 cancelled; 0 the job is not waiting for dependencies (nothing written)
-- Errors:  EMQVERSION keyspace of another major version; NOPERM the ACL denies a command
--          it writes with (before any write)
--@include common
--@include deps
--@include finished

local job_key = KEYS[1]
local deps_key = KEYS[2]
local waitdeps_key = KEYS[3]
local deplink_key = KEYS[4]
local cancelled_key = KEYS[5]
local meta_key = KEYS[6]
local events_key = KEYS[7]
local waiters_key = KEYS[8]
local dependents_key = KEYS[9]
local outbox_key = KEYS[10]
local id = ARGV[1]
local version = ARGV[2]

if not redis.call('ZSCORE', waitdeps_key, id) then return 0 end
local hook, denied = emq_finish_prepare(waiters_key, dependents_key, outbox_key)
if not denied then
  denied = emq_deps_denied({{'HSET', job_key, 'f', 'v'}, {'ZADD', cancelled_key, '0', 'm'},
    {'ZREM', waitdeps_key, 'm'}, {'DEL', deps_key}})
end
if denied then return redis.error_reply(denied) end
local cap = emq_events_cap(meta_key)
local now = emq_now()
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
redis.call('ZREM', waitdeps_key, id)
redis.call('ZREM', deplink_key, id)
redis.call('DEL', deps_key)
redis.call('HSET', job_key, 'state', 'cancelled', 'finished', emq_int(now))
redis.call('ZADD', cancelled_key, now, id)
emq_event(events_key, cap, 'cancelled', 'id', id)
emq_finished(hook, waiters_key, dependents_key, outbox_key, {id}, 'cancelled')
return 1
