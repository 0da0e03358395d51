-- cancel.lua: cancel a job, atomically. A waiting job (scheduled or pending) is cancelled
-- at once: its hash stays as its record (`state` = cancelled, `finished` = now) and it
-- joins the cancelled set (trimmed by retention like the completed and failed sets); its
-- waiters and dependents are told (includes/finished.lua). An active job is only marked
-- (job hash `cancel` = 1) and its id published on the queue's cancel channel: the Worker
-- running it stops its handler and ends it as cancelled itself (cancel_active.lua), so
-- only the lease holder ever ends a running job. A Worker that missed the message finds
-- the mark on its beat; asking again re-publishes (harmless).
-- An active job whose handler has not started (claimed by a Worker that holds it for a free
-- handler slot: its lease token is not the `worker` of its hash) never runs: it is
-- cancelled at once like a waiting one, its lease dropped (start.lua then skips it) and its
-- id published so its holder lets it go. A grouped one is only marked (its group's count of
-- active jobs is the holder's to free): its holder ends it as it starts, without its handler.
--
-- KEYS[1] job_key         job hash        emq:{q}:job:<id>
-- KEYS[2] pending_key     pending zset    emq:{q}:pending (or the job's group lane)
-- KEYS[3] delayed_key     delayed zset    emq:{q}:delayed
-- KEYS[4] meta_key        meta hash       emq:{q}:meta
-- KEYS[5] events_key      events stream   emq:{q}:events
-- KEYS[6] cancelled_key   cancelled zset  emq:{q}:cancelled
-- KEYS[7] active_key      active zset     emq:{q}:active
-- KEYS[8] waiters_key     waiters hash    emq:{q}:waiters (ref.wait: told on the job's done
--          channel)
-- KEYS[9] dependents_key  dependents hash emq:{q}:dependents (jobs other jobs depend on)
-- KEYS[10] outbox_key     outbox list     emq:{q}:outbox ("cancelled\0<id>" for a job with
--          dependents)
-- KEYS[11] leases_key     leases hash     emq:{q}:leases   (job id -> lease token)
-- KEYS[12] metrics_key    metrics hash    emq:{q}:metrics  (`cancelled` counts a held job ended
--          here, as cancel_active.lua counts a running one)
-- ARGV[1] id              job id
-- ARGV[2] version         keyspace version of the caller
-- ARGV[3] cancel_channel  the queue's cancel channel emq:{q}:cancel (a pub/sub channel, not a key)
-- Returns: 1 cancelled (its record kept; an active job whose handler had not started
--          too); 2 active: its worker was asked to stop it (the
--          job ends cancelled unless its handler finishes first); 0 not cancellable
--          (unknown, finished or already cancelled; nothing written)
-- Errors:  EMQVERSION keyspace of another major version; NOPERM the ACL denies PUBLISH on
--          the channel, or what the finish hook needs (7.0+: before any write)
--@include common
--@include finished

local job_key = KEYS[1]
local pending_key = KEYS[2]
local delayed_key = KEYS[3]
local meta_key = KEYS[4]
local events_key = KEYS[5]
local cancelled_key = KEYS[6]
local active_key = KEYS[7]
local waiters_key = KEYS[8]
local dependents_key = KEYS[9]
local outbox_key = KEYS[10]
local leases_key = KEYS[11]
local metrics_key = KEYS[12]
local id = ARGV[1]
local version = ARGV[2]
local cancel_channel = ARGV[3]

-- read first: a call that cancels nothing must not write (not even the fence's stamp)
local active = redis.call('ZSCORE', active_key, id)
if not active and not redis.call('ZSCORE', pending_key, id)
    and not redis.call('ZSCORE', delayed_key, id) then
  return 0
end
-- held: leased, not started under that lease, not grouped (see the header)
local held = false
if active then
  local token = redis.call('HGET', leases_key, id)
  local h = redis.call('HMGET', job_key, 'worker', 'group')
  held = token ~= false and h[1] ~= token and not h[2]
end
local hook, denied = nil, nil
if not active or held then
  hook, denied = emq_finish_prepare(waiters_key, dependents_key, outbox_key)
end
if not denied and active and redis.acl_check_cmd
    and not redis.acl_check_cmd('PUBLISH', cancel_channel, id) then
  denied = 'NOPERM this user has no permission to PUBLISH on ' .. cancel_channel
end
if denied then return redis.error_reply(denied) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local cap = emq_events_cap(meta_key)
if active and not held then  -- its worker ends it (cancel_active.lua): only the lease holder may
  redis.call('HSET', job_key, 'cancel', '1')
  redis.call('PUBLISH', cancel_channel, id)
  emq_event(events_key, cap, 'cancel_requested', 'id', id)
  return 2
end
local now = emq_now()
if held then
  redis.call('HDEL', leases_key, id)
  redis.call('ZREM', active_key, id)
  redis.call('PUBLISH', cancel_channel, id)  -- its holder lets it go now
  redis.call('HINCRBY', metrics_key, 'cancelled', 1)
end
redis.call('ZREM', pending_key, id)
redis.call('ZREM', delayed_key, id)
if redis.call('EXISTS', job_key) == 1 then
  redis.call('HSET', job_key, 'state', 'cancelled', 'finished', now)
  redis.call('ZADD', cancelled_key, now, id)
end
emq_event(events_key, cap, 'cancelled', 'id', id)
emq_finished(hook, waiters_key, dependents_key, outbox_key, {id}, 'cancelled')
return 1
