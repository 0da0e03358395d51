-- start.lua: phase two of taking work: stamp each claimed job as running and
-- return what the handler needs. A job whose lease is no longer ours (reaped
-- and re-claimed in between) is skipped. Re-sent with the same pairs (its reply was
-- lost), it counts nothing twice: a job this very token already started is returned as
-- started, with no second attempt or 'active' event. Under a queue-wide rate limit a
-- start is a use of the window: the token's window member (claim.lua's) is moved to the
-- start instant, and a token whose claim has left the window must find room again, else
-- its job is parked on the delayed set until the window opens (promote hands it back to
-- its lane or pending; no attempt counted). So the window always holds every start of
-- the last window ms: at most rate_max handler starts in any window, across workers.
-- Per-group rate limits (grate) work the same way on the group's own window, for the
-- groups the caller names (those its claim served: every grouped job it claimed is in one).
-- A paused queue (pause.lua) starts nothing: each claimed job is handed back the same way
-- (parked on the delayed set for 1 ms, no attempt counted), so a job claimed before
-- pause() returned is not started after it.
-- A lease on a job whose hash is gone (evicted, deleted by hand) is dropped and counted:
-- metrics 'orphaned' and an 'orphaned' event, never silently.
-- Expiry: a job enqueued with expires_ms holds `exp` (its run-at + E, server
-- ms). Claimed for its first run after that instant, it is not started: it ends as
-- `expired` (state, `finished`, its record on the expired zset, trimmed by retention like
-- cancelled), an 'expired' event and metrics counter, its lease dropped and its place in
-- the queue's rate window given back (a group window keeps it until it ages out); the
-- reply row is 0, so the worker never runs it. The finish hook (includes/finished.lua)
-- tells its waiters and dependents. A job that ran once (a retry) no longer expires.
--
-- KEYS[1] active_key       active zset     emq:{q}:active
-- KEYS[2] leases_key       leases hash     emq:{q}:leases
-- KEYS[3] meta_key         meta hash       emq:{q}:meta
-- KEYS[4] events_key       events stream   emq:{q}:events
-- KEYS[5] metrics_key      metrics hash    emq:{q}:metrics
-- KEYS[6] rate_key         rate zset       emq:{q}:rate     (lease token -> claim, then start,
--          instant)
-- KEYS[7] delayed_key      delayed zset    emq:{q}:delayed
-- KEYS[8] marker_key       marker zset     emq:{q}:marker
-- KEYS[9] grate_key        grate hash      emq:{q}:grate    (group -> "max:window")
-- KEYS[10] waiters_key     waiters hash    emq:{q}:waiters  (the finish hook's keys, for expired
--          jobs)
-- KEYS[11] dependents_key  dependents      emq:{q}:dependents
-- KEYS[12] outbox_key      outbox list     emq:{q}:outbox
-- KEYS[13] expired_key     expired zset    emq:{q}:expired
-- KEYS[14..] job hashes  emq:{q}:job:<id>, one per claimed job, in ARGV pair order, then
--          optionally one rate zset emq:{q}:g:<group>:rate per group name after the pairs
-- ARGV[1] version          keyspace version of the caller
-- ARGV[2..] pairs: job id, lease token (same order as the job keys), then optionally the
--          group names of the trailing rate keys (the groups the claim served)
-- Returns: one flat array (a table per job would cost the reply a few us per job): the
--          start instant (server ms), then one row per job in pair order:
--          started, the short row (most jobs) attempts, payload, enc, created when the job
--          has no opts, run_at, cancel mark or earlier failure and started at that instant;
--          else -1 then the full row: attempts, payload, enc, opts, created, run_at,
--          started, cancel, failed_before (attempts and the times as integers; enc, opts,
--          run_at nil when the hash omits them; started = when this token started it, the
--          instant the Worker hands back to complete.lua; cancel '1' when cancel.lua asked
--          for it while the job was held unstarted, so the Worker stops it as it starts,
--          else nil; failed_before 1 when the hash holds an earlier run's failure (an
--          'error' field) its success must clear, else nil: the Worker tells complete.lua
--          it need not); or a lone 0 when it was not started: its lease was lost (or the
--          job hash is gone, or the rate window had no room or the queue is paused: the
--          job waits on the delayed set; or it expired: ended)
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts; EMQVERSION keyspace of another major
--          version; NOPERM the finish hook's PUBLISH/RPUSH denied; EMQKEYTYPE the events
--          stream or metrics hash holds another type (each before any write)
--@include common
--@include rate
--@include finished

local active_key = KEYS[1]
local leases_key = KEYS[2]
local meta_key = KEYS[3]
local events_key = KEYS[4]
local metrics_key = KEYS[5]
local rate_key = KEYS[6]
local delayed_key = KEYS[7]
local marker_key = KEYS[8]
local grate_key = KEYS[9]
local waiters_key = KEYS[10]
local dependents_key = KEYS[11]
local outbox_key = KEYS[12]
local expired_key = KEYS[13]
local version = ARGV[1]

-- (the per-job loops read these: a local is a register, a global a table lookup)
local KEYS, ARGV, redis, tonumber = KEYS, ARGV, redis, tonumber

-- J jobs (a key and two ARGV each) and G groups (a key and a name each)
local njobs = #ARGV - #KEYS + 12
local ngroups = #KEYS - 13 - njobs
if #ARGV < 1 or njobs < 0 or ngroups < 0 then
  return redis.error_reply('EMQINPUT start needs one id/token pair per job key and one ' ..
    'name per group rate key')
end
local last_job = 13 + njobs
local hook, hook_err = emq_finish_prepare(waiters_key, dependents_key, outbox_key)
if hook_err then return redis.error_reply(hook_err) end
local cap = emq_events_cap(meta_key)
-- The keys written after the jobs' hashes, by type (a key of another type there would fail
-- the script with some jobs stamped active and their starts unreported).
local wrong = (cap and emq_key_type_error(events_key, 'stream'))
  or emq_key_type_error(metrics_key, 'hash')
if wrong then return redis.error_reply(wrong) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local now = emq_now()
local stamp = emq_int(now)
-- Every lease in one read (one bridge call per job fewer than a per-job HGET).
local ids = {}
for j = 1, njobs do ids[j] = ARGV[2 * j] end
local held = {}
for s = 1, njobs, 4000 do  -- (chunks: Lua's unpack() has a stack limit)
  local got = redis.call('HMGET', leases_key, unpack(ids, s, math.min(s + 3999, njobs)))
  for j = 1, #got do held[s + j - 1] = got[j] end
end

-- The queue's rate window (includes/rate.lua, as claim.lua's): room is re-checked at the
-- start instant.
local f = redis.call('HMGET', meta_key, 'rate_max', 'rate_window', 'paused')
local rate_max, window = emq_rate_spec(f[1], f[2])
local paused = f[3] == '1'
local limited = rate_max ~= nil
if limited then emq_window_prune(rate_key, now, window) end

-- Group windows of the named groups (rate-limited ones only), pruned once per call.
local gwin = {}
for j = 1, ngroups do
  local g = ARGV[2 + 2 * njobs + j - 1]
  local gmax, gspan = emq_group_rate_spec(grate_key, g)
  if gmax then
    gwin[g] = {k = last_job + j, max = gmax, span = gspan}  -- k: its index in KEYS
    emq_window_prune(KEYS[last_job + j], now, gspan)
  end
end
-- The group window a job's start uses (nil: none), from its options' group.
local function group_window(opts)
  if not next(gwin) or not opts or not string.find(opts, '"g"', 1, true) then return nil end
  local ok, o = pcall(cjson.decode, opts)
  if not ok or type(o) ~= 'table' or type(o.g) ~= 'string' then return nil end
  return gwin[o.g]
end

-- Whether this start may use its windows now: its token holds a place in each (its claim
-- is still there) or finds room; it is recorded in them at the start instant, after every
-- check.
local function window_admits(token, opts)
  if paused then return false, nil end
  local gw = group_window(opts)
  if limited and not emq_window_fits(rate_key, rate_max, token) then return false, gw end
  if gw and not emq_window_fits(KEYS[gw.k], gw.max, token) then return false, gw end
  if limited then emq_window_record(rate_key, window, token, now) end
  if gw then emq_window_record(KEYS[gw.k], gw.span, token, now) end
  return true
end
-- No window, no pause: every start is admitted without asking (most queues).
local unwindowed = not paused and not limited and next(gwin) == nil
-- No room: the job waits (parked) until the fuller window's oldest start leaves it.
local function defer(id, gw)
  local open = now + 1
  if limited then open = math.max(open, emq_window_opens(rate_key, window, now)) end
  if gw then open = math.max(open, emq_window_opens(KEYS[gw.k], gw.span, now)) end
  redis.call('HDEL', leases_key, id)
  redis.call('ZREM', active_key, id)
  redis.call('ZADD', delayed_key, emq_delayed_score(delayed_key, open), id)
  emq_wake_at(marker_key, open)
end

-- Past its expiry before its first start: ended as expired, never started.
local expired = {}
local function expire(id, key, token)
  redis.call('HDEL', leases_key, id)
  redis.call('ZREM', active_key, id)
  if limited then redis.call('ZREM', rate_key, token) end  -- its claim used no start
  redis.call('HSET', key, 'state', 'expired', 'finished', stamp)
  redis.call('ZADD', expired_key, now, id)
  emq_event_untrimmed(events_key, cap, 'expired', 'id', id)
  expired[#expired + 1] = id
end

-- One read of the job hash: every field (a fresh job has few, so this costs less than
-- naming the ten a start may need: each named field is a lookup and a reply element),
-- picked apart here. False for a field it lacks; no payload means the hash is gone.
-- `failed`: it holds an earlier run's failure ('error').
local function read_job(key)
  local a = redis.call('HGETALL', key)
  local payload, enc, opts, created, tries, run_at = false, false, false, false, false, false
  local worker, at, exp, cancel, failed = false, false, false, false, false
  for k = 1, #a, 2 do
    local f = a[k]
    -- (most frequent first: 'ps', in every hash and not needed here, ends its tests early)
    if f == 'payload' then payload = a[k + 1]
    elseif f == 'created' then created = a[k + 1]
    elseif f == 'ps' then -- not needed here
    elseif f == 'enc' then enc = a[k + 1]
    elseif f == 'attempts' then tries = a[k + 1]
    elseif f == 'worker' then worker = a[k + 1]
    elseif f == 'started' then at = a[k + 1]
    elseif f == 'opts' then opts = a[k + 1]
    elseif f == 'run_at' then run_at = a[k + 1]
    elseif f == 'exp' then exp = a[k + 1]
    elseif f == 'cancel' then cancel = a[k + 1]
    elseif f == 'error' then failed = true
    end
  end
  return payload, enc, opts, created, tries, run_at, worker, at, exp, cancel, failed
end

-- A stored time as a number (the reply's integer; false, a nil reply, for none). Parsed
-- once per distinct text: a batch's jobs mostly share their creation ms.
local parsed = {}
local function ms(v)
  if not v then return false end
  local n = parsed[v]
  if n == nil then
    n = tonumber(v) or false
    parsed[v] = n
  end
  return n
end

-- The reply: the start instant, then one row per job (see the header). Most started jobs
-- take the short row (each reply value costs Redis ~0.5 us of conversion and copying).
local out, nout = {now}, 1
-- A started job's row (false: a nil in the reply): short when only its attempts, payload,
-- enc and created say anything (no options, run-at, cancel mark or earlier failure, and
-- started now), else -1 and all nine values.
local function put(attempts, payload, enc, opts, created, run_at, at, cancel, failed)
  if not (opts or run_at or cancel or failed) and at == now and attempts > 0 then
    out[nout + 1], out[nout + 2], out[nout + 3], out[nout + 4] = attempts, payload, enc, created
    nout = nout + 4
    return
  end
  out[nout + 1], out[nout + 2], out[nout + 3], out[nout + 4] = -1, attempts, payload, enc
  out[nout + 5], out[nout + 6], out[nout + 7] = opts, created, run_at
  out[nout + 8], out[nout + 9], out[nout + 10] = at, cancel, failed
  nout = nout + 10
end
local orphaned = 0
local started, started_attempts, nstarted = {}, {}, 0  -- for the batched 'active' events
for i = 14, last_job do
  local id, token = ARGV[2 * (i - 13)], ARGV[2 * (i - 13) + 1]
  local key = KEYS[i]
  local ok = false
  if held[i - 13] == token then
    local payload, enc, opts, created, tries, run_at, worker, at, exp, cancel, failed =
      read_job(key)
    if not payload then
      -- a lease on a job whose hash vanished: drop the lease, count it, say so
      redis.call('HDEL', leases_key, id)
      redis.call('ZREM', active_key, id)
      orphaned = orphaned + 1
      emq_event_untrimmed(events_key, cap, 'orphaned', 'id', id)
    elseif worker == token then
      -- a re-sent start: this token started it already; report that run, write nothing
      put(tonumber(tries or '1') or 1, payload, enc, opts, ms(created), ms(run_at),
        tonumber(at or stamp), cancel, failed and 1)
      ok = true
    elseif exp and not tries and now > (tonumber(exp) or now) then
      expire(id, key, token)
    else
      local admitted, gw = true, nil
      if not unwindowed then admitted, gw = window_admits(token, opts) end
      if admitted then
        local attempts = (tonumber(tries or '0') or 0) + 1
        -- (a first run's count as text: Redis prints a number argument with snprintf)
        local count = attempts == 1 and '1' or emq_int(attempts)
        redis.call('HSET', key, 'attempts', count, 'state', 'active', 'started', stamp,
          'worker', token)
        nstarted = nstarted + 1
        started[nstarted], started_attempts[nstarted] = id, count
        -- (the cache looked up here first: a call per job costs more than the lookup)
        put(attempts, payload, enc, opts, created and (parsed[created] or ms(created)),
          run_at and ms(run_at), now, cancel, failed and 1)
        ok = true
      else
        defer(id, gw)
      end
    end
  end
  if not ok then  -- not started: the row is a lone 0
    nout = nout + 1
    out[nout] = 0
  end
end
if orphaned > 0 then redis.call('HINCRBY', metrics_key, 'orphaned', orphaned) end
-- one event entry per 16 started jobs (readers expand it: see emq_events_batched)
emq_events_batched(events_key, cap, 'active', started, {attempt = started_attempts})
if #expired > 0 then
  redis.call('HINCRBY', metrics_key, 'expired', #expired)
  emq_finished(hook, waiters_key, dependents_key, outbox_key, expired, 'expired')
end
emq_trim_events(events_key, cap)
return out
