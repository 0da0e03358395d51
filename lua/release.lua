-- release.lua: hand a claimed job back to pending untouched (graceful shutdown:
-- the worker stops before the handler ran or finished). The attempt it had
-- started is not counted.
--
-- KEYS[1] job_key      job hash        emq:{q}:job:<id>
-- KEYS[2] active_key   active zset     emq:{q}:active
-- KEYS[3] leases_key   leases hash     emq:{q}:leases
-- KEYS[4] pending_key  pending zset    emq:{q}:pending
-- KEYS[5] marker_key   marker zset     emq:{q}:marker
-- KEYS[6] meta_key     meta hash       emq:{q}:meta
-- KEYS[7] events_key   events stream   emq:{q}:events
-- ARGV[1] id           job id
-- ARGV[2] token        lease token from claim.lua
-- ARGV[3] version      keyspace version of the caller
-- Returns: 1 released, 0 the lease was no longer held (nothing changed)
-- Errors:  EMQVERSION keyspace of another major version; EMQKEYTYPE the active or
--          pending set, the marker or the events stream holds another type (before any
--          write)
--@include common

local job_key = KEYS[1]
local active_key = KEYS[2]
local leases_key = KEYS[3]
local pending_key = KEYS[4]
local marker_key = KEYS[5]
local meta_key = KEYS[6]
local events_key = KEYS[7]
local id = ARGV[1]
local token = ARGV[2]
local version = ARGV[3]

if redis.call('HGET', leases_key, id) ~= token then
  return 0
end
-- Every read before the first write (the job hash's included), then the keys written, by
-- type.
local exists = redis.call('EXISTS', job_key) == 1
local job = redis.call('HMGET', job_key, 'state', 'ps')
local cap = emq_events_cap(meta_key)
local wrong = emq_key_type_error(active_key, 'zset') or emq_key_type_error(pending_key, 'zset')
  or emq_key_type_error(marker_key, 'zset') or (cap and emq_key_type_error(events_key, 'stream'))
if wrong then return redis.error_reply(wrong) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
redis.call('HDEL', leases_key, id)
redis.call('ZREM', active_key, id)
if exists then
  if job[1] == 'active' then
    redis.call('HINCRBY', job_key, 'attempts', -1)
  end
  redis.call('HDEL', job_key, 'state')  -- waiting again: its set says where
  redis.call('ZADD', pending_key, job[2], id)
  emq_wake(marker_key)
  emq_event(events_key, cap, 'released', 'id', id)
end
return 1
