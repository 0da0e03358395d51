-- schedule_mint.lua: mint one occurrence of a schedule as an ordinary job and
-- move the schedule's single registry entry to its next run, atomically. A
-- compare-and-set on (registry score, generation) makes a second pump of the
-- same occurrence, or a pump planning under a cadence since replaced, a no-op;
-- the occurrence's job id is derived from (schedule, instant), so even a
-- matching CAS never writes a second job for one occurrence. Payload and job
-- options are read from the record here, so the job carries the newest options.
--
-- KEYS[1] repeat zset    emq:{q}:repeat
-- KEYS[2] record hash    emq:{q}:repeat:<name>
-- KEYS[3] job hash       emq:{q}:job:<occurrence id>
-- KEYS[4] pending zset   emq:{q}:pending
-- KEYS[5] delayed zset   emq:{q}:delayed
-- KEYS[6] marker zset    emq:{q}:marker
-- KEYS[7] meta hash      emq:{q}:meta
-- KEYS[8] counter        emq:{q}:counter
-- KEYS[9] events stream  emq:{q}:events
-- ARGV[1] schedule name
-- ARGV[2] expected registry score (epoch ms): the instant the caller planned from
-- ARGV[3] expected generation (the record's 'gen')
-- ARGV[4] occurrence instant, epoch ms (>= ARGV[2]; the job's run-at)
-- ARGV[5] next run, epoch ms (> ARGV[4]), or -1 when the cadence is exhausted
-- ARGV[6] occurrence job id (must start with JOB)
-- ARGV[7] keyspace version of the caller
-- Returns: 1 minted a job; 2 advanced the registry, the job already existed;
--          0 no-op (registry moved on, generation changed, or not due on the server clock)
-- Errors:  EMQKIND id without the JOB brand; EMQINPUT malformed numbers or incomplete
--          record; EMQRANGE instants out of range; EMQVERSION keyspace of another major version
--@include common
--@include admit
--@include schedule

local name, gen, id = ARGV[1], ARGV[3], ARGV[6]
local expected, occ, nxt = tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
if string.sub(id, 1, 3) ~= 'JOB' then
  return redis.error_reply('EMQKIND job id must start with JOB')
end
if not expected or not occ or not nxt or expected % 1 ~= 0 or occ % 1 ~= 0 or nxt % 1 ~= 0
    or occ < expected or (nxt ~= -1 and nxt <= occ) then
  return redis.error_reply('EMQINPUT mint needs integers expected <= occurrence < next (or -1)')
end
if occ - EMQ_EPOCH > EMQ_MAX_OFFSET or nxt - EMQ_EPOCH > EMQ_MAX_OFFSET then
  return redis.error_reply('EMQRANGE instant beyond the exact range of scores')
end

local score = redis.call('ZSCORE', KEYS[1], name)
if not score or tonumber(score) ~= expected then return 0 end
if redis.call('HGET', KEYS[2], 'gen') ~= gen then return 0 end
local now = emq_now()
if occ > now then return 0 end  -- never mint ahead of the server clock
local f = redis.call('HMGET', KEYS[2], 'payload', 'enc', 'opts', 'prio')
local prio = tonumber(f[4] or '')
if not f[1] or not f[2] or not f[3] or not prio then
  return redis.error_reply('EMQINPUT schedule record ' .. name .. ' is incomplete')
end
local err = emq_fence(KEYS[7], ARGV[7])
if err then return redis.error_reply(err) end

local minted = 2
if redis.call('EXISTS', KEYS[3]) == 0 then
  -- run-at = the occurrence instant: a past instant is pending at once
  local state = emq_admit(KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8], id, f[1], f[2], f[3],
    prio, occ, now)
  redis.call('HSET', KEYS[3], 'sched', name, 'occ', emq_int(occ))
  emq_event(KEYS[9], emq_events_cap(KEYS[7]), 'enqueued', 'id', id, 'state', state,
    'schedule', name)
  minted = 1
end
if nxt == -1 then
  redis.call('ZADD', KEYS[1], '+inf', name)  -- exhausted: listed, never due
else
  redis.call('ZADD', KEYS[1], nxt, name)
  emq_wake_for_run(KEYS[6], nxt, now)  -- blocked workers wake at the next run, not on a tick
end
redis.call('HSET', KEYS[2], 'last', emq_int(occ), 'last_job', id)
return minted
