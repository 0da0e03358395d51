-- schedule_mint.lua: mint one occurrence of a schedule as an ordinary job and
-- move the schedule's single registry entry to its next run, atomically. A
-- compare-and-set on (registry score, generation) makes a second pump of the
-- same occurrence, or a pump planning under a cadence since replaced, a no-op;
-- the occurrence's job id is derived from (schedule, instant), so even a
-- matching CAS never writes a second job for one occurrence. Payload and job
-- options are read from the record here, so the job carries the newest options.
--
-- KEYS[1] repeat_key      repeat zset     emq:{q}:repeat
-- KEYS[2] record_key      record hash     emq:{q}:repeat:<name>
-- KEYS[3] job_key         job hash        emq:{q}:job:<occurrence id>
-- KEYS[4] pending_key     pending zset    emq:{q}:pending
-- KEYS[5] delayed_key     delayed zset    emq:{q}:delayed
-- KEYS[6] marker_key      marker zset     emq:{q}:marker
-- KEYS[7] meta_key        meta hash       emq:{q}:meta
-- KEYS[8] counter_key     counter         emq:{q}:counter
-- KEYS[9] events_key      events stream   emq:{q}:events
-- ARGV[1] name            schedule name
-- ARGV[2] expected_score  expected registry score (epoch ms): the instant the caller planned from
-- ARGV[3] gen             expected generation (the record's 'gen')
-- ARGV[4] occurrence_ms   occurrence instant, epoch ms (>= ARGV[2]; the job's run-at)
-- ARGV[5] next_run_ms     next run, epoch ms (> ARGV[4]), or -1 when the cadence is exhausted
-- ARGV[6] id              occurrence job id (must start with JOB)
-- ARGV[7] version         keyspace version of the caller
-- Returns: 1 minted a job; 2 advanced the registry, the job already existed;
--          0 no-op (registry moved on, generation changed, or not due on the server clock)
-- Errors:  EMQKIND id without the JOB brand; EMQINPUT an id with ':', malformed numbers or
--          incomplete record; EMQRANGE instants out of range; EMQVERSION keyspace of another major
--          version; EMQKEYTYPE a queue key it writes holds another type. Each before any write.
--@include common
--@include admit
--@include schedule

local repeat_key = KEYS[1]
local record_key = KEYS[2]
local job_key = KEYS[3]
local pending_key = KEYS[4]
local delayed_key = KEYS[5]
local marker_key = KEYS[6]
local meta_key = KEYS[7]
local counter_key = KEYS[8]
local events_key = KEYS[9]
local name = ARGV[1]
local expected_score = ARGV[2]
local gen = ARGV[3]
local occurrence_ms = ARGV[4]
local next_run_ms = ARGV[5]
local id = ARGV[6]
local version = ARGV[7]

local expected, occ, nxt = tonumber(expected_score), tonumber(occurrence_ms), tonumber(next_run_ms)
local bad_id = emq_new_id_error(id)
if bad_id then return redis.error_reply(bad_id) end
if not expected or not occ or not nxt or expected % 1 ~= 0 or occ % 1 ~= 0 or nxt % 1 ~= 0
    or occ < expected or (nxt ~= -1 and nxt <= occ) then
  return redis.error_reply('EMQINPUT mint needs integers expected <= occurrence < next (or -1)')
end
if occ - EMQ_EPOCH > EMQ_MAX_OFFSET or nxt - EMQ_EPOCH > EMQ_MAX_OFFSET then
  return redis.error_reply('EMQRANGE instant beyond the exact range of scores')
end

local score = redis.call('ZSCORE', repeat_key, name)
if not score or tonumber(score) ~= expected then return 0 end
if redis.call('HGET', record_key, 'gen') ~= gen then return 0 end
local now = emq_now()
if occ > now then return 0 end  -- never mint ahead of the server clock
local f = redis.call('HMGET', record_key, 'payload', 'enc', 'opts', 'prio')
local prio = tonumber(f[4] or '')
if not f[1] or not f[2] or not f[3] or not prio then
  return redis.error_reply('EMQINPUT schedule record ' .. name .. ' is incomplete')
end
local new_job = redis.call('EXISTS', job_key) == 0
local cap = emq_events_cap(meta_key)
local wrong = new_job and emq_admit_types(nil, pending_key, marker_key, events_key, cap ~= nil)
if wrong then return redis.error_reply(wrong) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end

local minted = 2
if new_job then
  -- run-at = the occurrence instant: a past instant is pending at once
  local state = emq_admit(job_key, pending_key, delayed_key, marker_key, counter_key, id, f[1],
    f[2], f[3], prio, occ, now)
  redis.call('HSET', job_key, 'sched', name, 'occ', emq_int(occ))
  emq_event(events_key, cap, 'enqueued', 'id', id, 'state', state,
    'schedule', name)
  minted = 1
end
if nxt == -1 then
  redis.call('ZADD', repeat_key, '+inf', name)  -- exhausted: listed, never due
else
  redis.call('ZADD', repeat_key, nxt, name)
  emq_wake_for_run(marker_key, nxt, now)  -- blocked workers wake at the next run, not on a tick
end
redis.call('HSET', record_key, 'last', emq_int(occ), 'last_job', id)
return minted
