-- cancel_active.lua: a Worker ends a job it runs as cancelled, with its lease token: the
-- job was cancelled while it ran (cancel.lua marked it) and its handler has stopped, or
-- was abandoned after the grace. Never retried: the hash stays as its record (`state` =
-- cancelled, `finished` = now), it joins the cancelled set (trimmed by retention), its
-- waiters and dependents are told (includes/finished.lua), the `cancelled` counter counts.
--
-- KEYS[1] job_key         job hash        emq:{q}:job:<id>
-- KEYS[2] active_key      active zset     emq:{q}:active
-- KEYS[3] leases_key      leases hash     emq:{q}:leases
-- KEYS[4] cancelled_key   cancelled zset  emq:{q}:cancelled
-- KEYS[5] meta_key        meta hash       emq:{q}:meta
-- KEYS[6] events_key      events stream   emq:{q}:events
-- KEYS[7] metrics_key     metrics hash    emq:{q}:metrics
-- KEYS[8] waiters_key     waiters hash    emq:{q}:waiters (ref.wait: told on the job's done
--          channel)
-- KEYS[9] dependents_key  dependents hash emq:{q}:dependents (jobs other jobs depend on)
-- KEYS[10] outbox_key     outbox list     emq:{q}:outbox ("cancelled\0<id>" for a job with
--          dependents)
-- ARGV[1] id              job id
-- ARGV[2] token           lease token from claim.lua
-- ARGV[3] version         keyspace version of the caller
-- Returns: 1 ended as cancelled; 0 this very token ended it already (a call re-sent after
--          its reply was lost: nothing is rewritten)
-- Errors:  EMQLEASE the lease is no longer held by this worker; EMQVERSION keyspace of
--          another major version; NOPERM the ACL denies what the finish hook needs
--          (7.0+: before any write)
--@include common
--@include finished

local job_key = KEYS[1]
local active_key = KEYS[2]
local leases_key = KEYS[3]
local cancelled_key = KEYS[4]
local meta_key = KEYS[5]
local events_key = KEYS[6]
local metrics_key = KEYS[7]
local waiters_key = KEYS[8]
local dependents_key = KEYS[9]
local outbox_key = KEYS[10]
local id = ARGV[1]
local token = ARGV[2]
local version = ARGV[3]

if redis.call('HGET', leases_key, id) ~= token then
  -- tokens are unique: a job cancelled under our token is this same call, re-sent
  local f = redis.call('HMGET', job_key, 'state', 'worker')
  if f[1] == 'cancelled' and f[2] == token then return 0 end
  return redis.error_reply('EMQLEASE lease on ' .. id .. ' is no longer held by this worker')
end
local hook, denied = emq_finish_prepare(waiters_key, dependents_key, outbox_key)
if denied then return redis.error_reply(denied) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local now = emq_now()
redis.call('HDEL', leases_key, id)
redis.call('ZREM', active_key, id)
redis.call('HSET', job_key, 'state', 'cancelled', 'finished', emq_int(now), 'worker', token)
redis.call('ZADD', cancelled_key, now, id)
redis.call('HINCRBY', metrics_key, 'cancelled', 1)
local attempt = redis.call('HGET', job_key, 'attempts') or '0'
emq_event(events_key, emq_events_cap(meta_key), 'cancelled', 'id', id, 'attempt', attempt)
emq_finished(hook, waiters_key, dependents_key, outbox_key, {id}, 'cancelled')
return 1
