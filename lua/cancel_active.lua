-- cancel_active.lua: a Worker ends a job it runs as cancelled, with its lease token: the
-- job was cancelled while it ran (cancel.lua marked it) and its handler has stopped, or
-- was abandoned after the grace. Never retried: the hash stays as its record (`state` =
-- cancelled, `finished` = now), it joins the cancelled set (trimmed by retention), its
-- waiters and dependents are told (includes/finished.lua), the `cancelled` counter counts.
--
-- KEYS[1] job hash         emq:{q}:job:<id>
-- KEYS[2] active zset      emq:{q}:active
-- KEYS[3] leases hash      emq:{q}:leases
-- KEYS[4] cancelled zset   emq:{q}:cancelled
-- KEYS[5] meta hash        emq:{q}:meta
-- KEYS[6] events stream    emq:{q}:events
-- KEYS[7] metrics hash     emq:{q}:metrics
-- KEYS[8] waiters hash     emq:{q}:waiters (ref.wait: told on the job's done channel)
-- KEYS[9] dependents hash  emq:{q}:dependents (jobs other jobs depend on)
-- KEYS[10] outbox list     emq:{q}:outbox ("cancelled\0<id>" for a job with dependents)
-- ARGV[1] job id
-- ARGV[2] lease token from claim.lua
-- ARGV[3] keyspace version of the caller
-- Returns: 1 ended as cancelled; 0 this very token ended it already (a call re-sent after
--          its reply was lost: nothing is rewritten)
-- Errors:  EMQLEASE the lease is no longer held by this worker; EMQVERSION keyspace of
--          another major version; NOPERM the ACL denies what the finish hook needs
--          (7.0+: before any write)
--@include common
--@include finished

local id, token = ARGV[1], ARGV[2]
if redis.call('HGET', KEYS[3], id) ~= token then
  -- tokens are unique: a job cancelled under our token is this same call, re-sent
  local f = redis.call('HMGET', KEYS[1], 'state', 'worker')
  if f[1] == 'cancelled' and f[2] == token then return 0 end
  return redis.error_reply('EMQLEASE lease on ' .. id .. ' is no longer held by this worker')
end
local hook, denied = emq_finish_prepare(KEYS[8], KEYS[9], KEYS[10])
if denied then return redis.error_reply(denied) end
local err = emq_fence(KEYS[5], ARGV[3])
if err then return redis.error_reply(err) end
local now = emq_now()
redis.call('HDEL', KEYS[3], id)
redis.call('ZREM', KEYS[2], id)
redis.call('HSET', KEYS[1], 'state', 'cancelled', 'finished', emq_int(now), 'worker', token)
redis.call('ZADD', KEYS[4], now, id)
redis.call('HINCRBY', KEYS[7], 'cancelled', 1)
local attempt = redis.call('HGET', KEYS[1], 'attempts') or '0'
emq_event(KEYS[6], emq_events_cap(KEYS[5]), 'cancelled', 'id', id, 'attempt', attempt)
emq_finished(hook, KEYS[8], KEYS[9], KEYS[10], {id}, 'cancelled')
return 1
