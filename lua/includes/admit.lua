-- includes/admit.lua: writing a new job: shared by enqueue.lua and the schedule
-- pump, so a minted occurrence is exactly an ordinary job. Needs common.lua.

-- Admit job `id` (its hash at `job_key`): pending now when run_at <= now, else
-- parked on the delayed set. The caller has validated everything and checked
-- that the job does not exist. Returns 'pending' or 'scheduled'.
-- Fields holding their defaults are not stored (readers supply them): 'enc' when
-- 'j' (JSON), 'opts' when empty (the library defaults, see emqfast/options.py),
-- 'attempts' while 0 (start.lua creates it). A waiting job has no 'state' (the set
-- holding it says pending or scheduled) and a parked one no 'run_at' (its delayed
-- score holds it to the ms; promote.lua stamps it on release), which keeps the
-- hashes of the millions of jobs a queue may hold waiting small.
-- `dscore` is the delayed score from emq_admit_score (read before the caller's first
-- write); nil reads it here.
local function emq_admit(job_key, pending, delayed, marker, counter,
                         id, payload, enc, opts, priority, run_at, now, dscore)
  local scheduled = run_at > now
  if scheduled and not dscore then dscore = emq_delayed_score(delayed, run_at) end
  local seq = redis.call('INCR', counter)
  local ps = priority * 4294967296 + (seq % 4294967296)
  local fields = {'payload', payload, 'ps', emq_int(ps), 'created', emq_int(now)}
  if enc ~= 'j' then
    fields[#fields + 1] = 'enc'
    fields[#fields + 1] = enc
  end
  if opts ~= '' then
    fields[#fields + 1] = 'opts'
    fields[#fields + 1] = opts
  end
  redis.call('HSET', job_key, unpack(fields))
  if scheduled then
    redis.call('ZADD', delayed, dscore, id)
    emq_wake_at(marker, run_at)
    return 'scheduled'
  end
  redis.call('ZADD', pending, ps, id)
  emq_wake(marker)
  return 'pending'
end

-- Validate an enqueue's id, priority and timing before any write (ARGV[1] and
-- ARGV[5..7] of enqueue.lua and enqueue_group.lua). Returns an error reply text,
-- or nil followed by priority, run_at and now (server clock).
local function emq_check_admission(id, priority_arg, mode, value_arg)
  local bad_id = emq_new_id_error(id)
  if bad_id then return bad_id end
  local priority = tonumber(priority_arg)
  if not priority or priority < 0 or priority > 2097151 or priority % 1 ~= 0 then
    return 'EMQRANGE priority must be an integer in [0, 2097151]'
  end
  local value = tonumber(value_arg)
  if not value or value % 1 ~= 0 or (mode ~= 'now' and mode ~= 'at' and mode ~= 'in') then
    return 'EMQINPUT mode must be now/at/in with an integer ms value'
  end
  if value < 0 then
    return 'EMQRANGE delay / run-at must not be negative'
  end
  local now = emq_now()
  local run_at = now
  if mode == 'at' then run_at = value elseif mode == 'in' then run_at = now + value end
  if run_at - EMQ_EPOCH > EMQ_MAX_OFFSET then
    return 'EMQRANGE run-at beyond the exact range of delayed scores'
  end
  return nil, priority, run_at, now
end

-- The delayed score a job due at `run_at` gets (nil when due now): a read, so callers
-- make it before their first write and hand it to emq_admit.
local function emq_admit_score(delayed, run_at, now)
  if run_at > now then return emq_delayed_score(delayed, run_at) end
  return nil
end

-- Check, before the first write, that the caller's ACL allows every write an admission
-- makes (Redis does not roll back a script that fails half-way: a NOPERM on the XADD
-- after the HSET would leave a job without its event, or in no set). Returns a NOPERM
-- error text, or nil. `with_events` is false when events are off. About 0.3 us per check, so
-- batches run it once per chunk (ARGV 'acl' = '0' for the calls after a checked one on
-- the same connection). Redis < 7 has no redis.acl_check_cmd: skipped there. `acl_arg`
-- is the script's ACL argument ('0': skip); the set written is `delayed` when the job
-- got a delayed score (`dscore`), else `pending` (its lane for a grouped job).
local function emq_admit_denied(acl_arg, dscore, job_key, pending, delayed, marker, counter,
                                events, with_events)
  local check = redis.acl_check_cmd
  if acl_arg == '0' or not check then return nil end
  local set_key = pending
  if dscore then set_key = delayed end
  if check('INCR', counter) and check('HSET', job_key, 'f', 'v')
      and check('ZADD', set_key, 'LT', '0', 'm') and check('ZADD', marker, 'LT', '0', 'm')
      and (not with_events or check('XADD', events, 'MAXLEN', '~', '1', '*', 'f', 'v')) then
    return nil
  end
  return 'NOPERM this user may not run every command an enqueue writes with ' ..
    '(INCR, HSET, ZADD, XADD on the queue keys): nothing was written'
end
