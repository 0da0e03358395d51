-- complete.lua: record the success of one or many jobs, each if and only if the
-- caller still holds its lease. A Worker acknowledges a whole batch of finished
-- jobs in one call: the fence, the clock, the event cap and the counter are paid
-- once per call instead of once per job (most of the per-job Redis CPU of a drain).
--
-- KEYS[1] active_key      active zset     emq:{q}:active
-- KEYS[2] leases_key      leases hash     emq:{q}:leases
-- KEYS[3] completed_key   completed zset  emq:{q}:completed (score = finish time, server ms)
-- KEYS[4] meta_key        meta hash       emq:{q}:meta
-- KEYS[5] events_key      events stream   emq:{q}:events
-- KEYS[6] metrics_key     metrics hash    emq:{q}:metrics
-- KEYS[7] waiters_key     waiters hash    emq:{q}:waiters (ref.wait: told on the job's done
--          channel)
-- KEYS[8] dependents_key  dependents hash emq:{q}:dependents (jobs other jobs depend on)
-- KEYS[9] outbox_key      outbox list     emq:{q}:outbox ("completed\0<id>" per completed job with
--          dependents)
-- KEYS[10..] job hashes   emq:{q}:job:<id>, one per ARGV group of four, same order
-- ARGV[1] version         keyspace version of the caller
-- ARGV[2..] groups of four: job id, lease token from claim.lua, result (stored as given:
--          JSON text, or a bytes result behind the marker "\xffb", see codec.py), then
--          the run as start.lua reported it to the Worker, in one text (a batch's jobs
--          mostly share it: it is parsed once per distinct text, and each argument costs
--          Redis more than the Lua that reads it): "<attempt>:<started ms, server
--          clock>", with ":c" after it when start.lua's row had no failed_before mark (the
--          hash held no earlier run's failure, and none can be written while this lease
--          holds: only its holder's fail.lua, or a reap that drops it), so there is no
--          'error' to clear (without it, any 'error' is cleared); '': read attempt and
--          started from the job hash (and clear any 'error')
-- Returns: one entry per job, in order: the run's times for the caller's histograms
--          (via metrics_add.lua): given the run record, the run ms (started -> now; the
--          caller knows the wait), else {wait ms, run ms} read from the hash (due ->
--          started, started -> now; -1 for a time not known); -1 (or {-1, -1} without a
--          run record) when this very token already completed the job (a re-sent ack:
--          nothing is rewritten), or the text 'EMQLEASE ...' when the lease expired and
--          the job was reaped, re-claimed or already ended (that job is left untouched), or
--          'EMQGONE ...' when the job's hash is gone (the queue's keys were deleted)
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts; EMQVERSION keyspace of another major version;
--          NOPERM the ACL denies PUBLISH on the done channels or RPUSH (before any write);
--          EMQKEYTYPE the active or completed set, the metrics hash, the events stream or
--          (with dependents) the outbox holds another type (before any write)
--@include common
--@include metrics
--@include finished

local active_key = KEYS[1]
local leases_key = KEYS[2]
local completed_key = KEYS[3]
local meta_key = KEYS[4]
local events_key = KEYS[5]
local metrics_key = KEYS[6]
local waiters_key = KEYS[7]
local dependents_key = KEYS[8]
local outbox_key = KEYS[9]
local version = ARGV[1]

if #ARGV < 5 or (#ARGV - 1) % 4 ~= 0 or (#ARGV - 1) / 4 ~= #KEYS - 9 then
  return redis.error_reply('EMQINPUT complete needs one id/token/result/run group per job key')
end
local hook, denied = emq_finish_prepare(waiters_key, dependents_key, outbox_key)
if denied then return redis.error_reply(denied) end
local cap = emq_events_cap(meta_key)
-- The keys written after the first job's hash, by type (a key of another type there would
-- fail the script with some jobs' hashes saying completed in no completed set). The leases
-- hash is read below before any write.
local wrong = emq_key_type_error(active_key, 'zset') or emq_key_type_error(completed_key, 'zset')
  or emq_key_type_error(metrics_key, 'hash') or (cap and emq_key_type_error(events_key, 'stream'))
if wrong then return redis.error_reply(wrong) end
local fenced = redis.call('HEXISTS', meta_key, 'version') == 1  -- before the fence writes it
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local now = emq_now()
local finished = emq_int(now)
-- Every lease in one read (chunked: Lua's unpack() has a stack limit).
local held = {}
for s = 2, #ARGV, 4 * 2000 do
  local ids, n = {}, #held
  for a = s, math.min(s + 4 * 2000 - 1, #ARGV), 4 do ids[(a - s) / 4 + 1] = ARGV[a] end
  local got = redis.call('HMGET', leases_key, unpack(ids))
  for j = 1, #got do held[n + j] = got[j] end
end
local out, done, scored, seen, attempts = {}, {}, {}, {}, {}
local nd = 0  -- jobs done so far (an index kept, not #done: a length is a search per use)
-- A run text parsed: {attempt text, started ms, clean}, or false for '' (none given).
local runs = {}
local function run_of(text)
  local run = runs[text]
  if run == nil then
    local attempt, at, clean = string.match(text, '^(%d+):(%d+)(.*)$')
    run = attempt and (clean == '' or clean == ':c') and {attempt, tonumber(at), clean ~= ''}
      or false
    runs[text] = run
  end
  return run
end
for i = 10, #KEYS do
  local a = 4 * (i - 10) + 2
  local id, token, key = ARGV[a], ARGV[a + 1], KEYS[i]
  local run = run_of(ARGV[a + 3])
  -- (a job named twice in one call: its lease is dropped only at the end, so the
  -- second mention must not pass the lease check again)
  if not seen[id] and held[i - 9] == token then
    seen[id] = true
    local entry, attempt
    if run then  -- the Worker's own record of the run: no read of the hash, and
      -- the run alone comes back (the Worker knows the wait it sent)
      entry, attempt = math.max(now - run[2], 0), run[1]
    else
      local wait, elapsed
      wait, elapsed, attempt = emq_run_times(key, now)  -- one read: times + attempt
      entry = {wait, elapsed}
    end
    redis.call('HSET', key, 'state', 'completed', 'result', ARGV[a + 2], 'finished', finished)
    -- an earlier attempt's failure is not this outcome's
    if not (run and run[3]) then redis.call('HDEL', key, 'error', 'traceback') end
    nd = nd + 1
    done[nd], attempts[nd] = id, attempt
    scored[2 * nd - 1], scored[2 * nd] = finished, id  -- (text: a number is printed per job)
    out[i - 9] = entry
  else
    -- An ack re-sent after a lost reply (connection dropped, Redis restarted) finds its
    -- own completion: tokens are unique, so this is the same outcome, not a takeover.
    local f = redis.call('HMGET', key, 'state', 'worker')
    if f[1] == 'completed' and f[2] == token then
      out[i - 9] = run and -1 or {-1, -1}  -- timed already
    else
      out[i - 9] = emq_lease_lost(key, id, meta_key, fenced)
    end
  end
end
-- The set writes once per call (chunked: Lua's unpack() has a stack limit).
for s = 1, #done, 2000 do
  local e = math.min(s + 1999, #done)
  redis.call('HDEL', leases_key, unpack(done, s, e))
  redis.call('ZREM', active_key, unpack(done, s, e))
  redis.call('ZADD', completed_key, unpack(scored, 2 * s - 1, 2 * e))
end
if #done > 0 then redis.call('HINCRBY', metrics_key, 'completed', #done) end
-- one event entry per 16 completions (readers expand it: see emq_events_batched)
emq_events_batched(events_key, cap, 'completed', done, {attempt = attempts})
emq_finished(hook, waiters_key, dependents_key, outbox_key, done, 'completed')
emq_trim_events(events_key, cap)
return out
