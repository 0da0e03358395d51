-- progress.lua: record a running job's progress (job.progress(value) in a handler),
-- if and only if the caller still holds its lease; appends a 'progress' event.
--
-- KEYS[1] job_key     job hash        emq:{q}:job:<id>
-- KEYS[2] leases_key  leases hash     emq:{q}:leases
-- KEYS[3] meta_key    meta hash       emq:{q}:meta
-- KEYS[4] events_key  events stream   emq:{q}:events
-- ARGV[1] id          job id
-- ARGV[2] token       lease token from claim.lua
-- ARGV[3] progress    progress value (JSON text, validated above the wire)
-- ARGV[4] version     keyspace version of the caller
-- Returns: 1
-- Errors:  EMQLEASE the lease is no longer held by this worker; EMQGONE the job's hash is
--          gone while leased (the queue's keys were deleted);
--          EMQVERSION keyspace of another major version
--@include common

local job_key = KEYS[1]
local leases_key = KEYS[2]
local meta_key = KEYS[3]
local events_key = KEYS[4]
local id = ARGV[1]
local token = ARGV[2]
local progress = ARGV[3]
local version = ARGV[4]

if redis.call('HGET', leases_key, id) ~= token then
  local lost = emq_lease_lost(job_key, id, meta_key)
  return redis.error_reply(lost)
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
redis.call('HSET', job_key, 'progress', progress)
emq_event(events_key, emq_events_cap(meta_key), 'progress', 'id', id, 'value', progress)
return 1
