-- cancel.lua: cancel a job, atomically. A waiting job (scheduled or pending) is cancelled
-- at once: its hash stays as its record (`state` = cancelled, `finished` = now) and it
-- joins the cancelled set (trimmed by retention like the completed and failed sets); its
-- waiters and dependents are told (includes/finished.lua). An active job is only marked
-- (job hash `cancel` = 1) and its id published on the queue's cancel channel: the Worker
-- running it stops its handler and ends it as cancelled itself (cancel_active.lua), so
-- only the lease holder ever ends a running job. A Worker that missed the message finds
-- the mark on its beat; asking again re-publishes (harmless).
--
-- KEYS[1] job hash         emq:{q}:job:<id>
-- KEYS[2] pending zset     emq:{q}:pending (or the job's group lane)
-- KEYS[3] delayed zset     emq:{q}:delayed
-- KEYS[4] meta hash        emq:{q}:meta
-- KEYS[5] events stream    emq:{q}:events
-- KEYS[6] cancelled zset   emq:{q}:cancelled
-- KEYS[7] active zset      emq:{q}:active
-- KEYS[8] waiters hash     emq:{q}:waiters (ref.wait: told on the job's done channel)
-- KEYS[9] dependents hash  emq:{q}:dependents (jobs other jobs depend on)
-- KEYS[10] outbox list     emq:{q}:outbox ("cancelled\0<id>" for a job with dependents)
-- ARGV[1] job id
-- ARGV[2] keyspace version of the caller
-- ARGV[3] the queue's cancel channel emq:{q}:cancel (a pub/sub channel, not a key)
-- Returns: 1 cancelled (its record kept); 2 active: its worker was asked to stop it (the
--          job ends cancelled unless its handler finishes first); 0 not cancellable
--          (unknown, finished or already cancelled; nothing written)
-- Errors:  EMQVERSION keyspace of another major version; NOPERM the ACL denies PUBLISH on
--          the channel, or what the finish hook needs (7.0+: before any write)
--@include common
--@include finished

local id = ARGV[1]
-- read first: a call that cancels nothing must not write (not even the fence's stamp)
local active = redis.call('ZSCORE', KEYS[7], id)
if not active and not redis.call('ZSCORE', KEYS[2], id)
    and not redis.call('ZSCORE', KEYS[3], id) then
  return 0
end
local hook, denied = nil, nil
if not active then
  hook, denied = emq_finish_prepare(KEYS[8], KEYS[9], KEYS[10])
elseif redis.acl_check_cmd and not redis.acl_check_cmd('PUBLISH', ARGV[3], id) then
  denied = 'NOPERM this user has no permission to PUBLISH on ' .. ARGV[3]
end
if denied then return redis.error_reply(denied) end
local err = emq_fence(KEYS[4], ARGV[2])
if err then return redis.error_reply(err) end
local cap = emq_events_cap(KEYS[4])
if active then  -- its worker ends it (cancel_active.lua): only the lease holder may
  redis.call('HSET', KEYS[1], 'cancel', '1')
  redis.call('PUBLISH', ARGV[3], id)
  emq_event(KEYS[5], cap, 'cancel_requested', 'id', id)
  return 2
end
local now = emq_now()
redis.call('ZREM', KEYS[2], id)
redis.call('ZREM', KEYS[3], id)
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'finished', now)
  redis.call('ZADD', KEYS[6], now, id)
end
emq_event(KEYS[5], cap, 'cancelled', 'id', id)
emq_finished(hook, KEYS[8], KEYS[9], KEYS[10], {id}, 'cancelled')
return 1
