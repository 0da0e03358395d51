-- progress.lua: record a running job's progress (job.progress(value) in a handler),
-- if and only if the caller still holds its lease; appends a 'progress' event.
--
-- KEYS[1] job hash       emq:{q}:job:<id>
-- KEYS[2] leases hash    emq:{q}:leases
-- KEYS[3] meta hash      emq:{q}:meta
-- KEYS[4] events stream  emq:{q}:events
-- ARGV[1] job id
-- ARGV[2] lease token from claim.lua
-- ARGV[3] progress value (JSON text, validated above the wire)
-- ARGV[4] keyspace version of the caller
-- Returns: 1
-- Errors:  EMQLEASE the lease is no longer held by this worker;
--          EMQVERSION keyspace of another major version
--@include common

if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then
  return redis.error_reply('EMQLEASE lease on ' .. ARGV[1] .. ' is no longer held by this worker')
end
local err = emq_fence(KEYS[3], ARGV[4])
if err then return redis.error_reply(err) end
redis.call('HSET', KEYS[1], 'progress', ARGV[3])
emq_event(KEYS[4], emq_events_cap(KEYS[3]), 'progress', 'id', ARGV[1], 'value', ARGV[3])
return 1
