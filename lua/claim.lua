-- claim.lua: lease up to N pending jobs to one worker (lowest score first).
-- Phase one of taking work: it pops ids and records their leases without touching job
-- hashes (their keys are unknown until the pop); start.lua then stamps each claimed job,
-- with its key declared. A queue-wide rate limit (meta 'rate_max' jobs per 'rate_window'
-- ms, set by configure.lua; includes/rate.lua) caps how many jobs are claimed in any
-- sliding window on the server clock. With the optional group keys it also serves group
-- lanes (includes/turns.lua): one job per ready group per turn, the flat pending set
-- taking its turn like one more group (its place in the ring's numbering is meta
-- 'fturn'). A group at its concurrency cap, or whose own rate window (grate hash:
-- group -> "max:window") is full, is PARKED on the ring (includes/groups.lua: a negative
-- score, out of the turn order) until its window opens or a slot frees (group_free.lua
-- after a finished job, group_join.lua, or the cap re-check ARGV[6] ms later), so claims
-- find ready groups in bounded work however many are capped or limited, and an idle
-- worker sleeps on the marker until the first parked group's re-check.
--
-- KEYS[1] pending_key  pending zset    emq:{q}:pending
-- KEYS[2] active_key   active zset     emq:{q}:active   (score = lease deadline, server ms)
-- KEYS[3] leases_key   leases hash     emq:{q}:leases   (job id -> lease token)
-- KEYS[4] meta_key     meta hash       emq:{q}:meta
-- KEYS[5] marker_key   marker zset     emq:{q}:marker
-- KEYS[6] delayed_key  delayed zset    emq:{q}:delayed
-- KEYS[7] counter_key  counter         emq:{q}:counter
-- KEYS[8] rate_key     rate zset       emq:{q}:rate     (lease token -> claim instant, last window
--          only)
-- KEYS[9..] optional group keys, then per group name ARGV[9..] two keys: its lane
--          emq:{q}:g:<group>:pending and its rate zset emq:{q}:g:<group>:rate (KEYS[14..],
--          read by index):
--   KEYS[9] ring_key  groups ring zset emq:{q}:groups
--   KEYS[10] gactive_key  gactive zset emq:{q}:gactive
--   KEYS[11] glimit_key  glimit hash emq:{q}:glimit
--   KEYS[12] grate_key  grate hash emq:{q}:grate
--   KEYS[13] record_key  the worker's claim record hash emq:{q}:w:<worker>:claim
-- ARGV[1] max_jobs     max jobs to claim (>= 1)
-- ARGV[2] lease_ms     lease length ms
-- ARGV[3] worker_id    worker id (prefix of the lease tokens)
-- ARGV[4] version      keyspace version of the caller
-- ARGV[5..] optional with the group keys, then ARGV[9..] the group names of the lane/rate
--          key pairs KEYS[14..] (from the previous claim's reply; re-checked; read by index):
--   ARGV[5] ready_groups  ready groups to name in the reply
--   ARGV[6] cap_recheck_ms  ms until a group parked at its cap is re-checked (a freed slot
--          unparks it sooner)
--   ARGV[7] per_turn  jobs per group per turn
--   ARGV[8] request_id  request id of this claim ('' = none; a claim re-sent with the id
--          of the worker's last claim that leased jobs pops nothing and returns that
--          claim's pairs still leased)
-- Returns: {now_ms, status, next_due_ms, id1, token1, id2, token2, ...}, and with the group
--          keys one last element: the names of the next ready groups (ring head, ARGV[5] of
--          them)
--          status 1 = claimed (maybe 0 jobs), 0 = queue paused, 2 = rate limited (jobs
--          wait but the queue's window, or every served group's window, admits none now;
--          nothing claimed);
--          next_due_ms = run-at of the earliest delayed job, -1 when none; with nothing
--          claimed, the earliest parked group's re-check instead when that comes first
--          (the marker is set then too), and status 2 when a full window holds it;
--          'now' when live lanes this claim was not told about wait (come back at once).
-- Errors:  EMQINPUT bad count or lease (integers: count in [1, 10000], the most one Worker
--          batch takes, so one call stays bounded; lease >= 1 ms);
--          EMQVERSION keyspace of another major version; EMQKEYTYPE the active set, leases
--          hash or marker holds another type (before anything is popped)
--@include common
--@include groups
--@include rate
--@include turns

local pending_key = KEYS[1]
local active_key = KEYS[2]
local leases_key = KEYS[3]
local meta_key = KEYS[4]
local marker_key = KEYS[5]
local delayed_key = KEYS[6]
local counter_key = KEYS[7]
local rate_key = KEYS[8]
local ring_key = KEYS[9]
local gactive_key = KEYS[10]
local glimit_key = KEYS[11]
local grate_key = KEYS[12]
local record_key = KEYS[13]
local max_jobs = ARGV[1]
local lease_ms = ARGV[2]
local worker_id = ARGV[3]
local version = ARGV[4]
local ready_groups = ARGV[5]
local cap_recheck_ms = ARGV[6]
local per_turn = ARGV[7]
local request_id = ARGV[8]

local n = tonumber(max_jobs)
local lease = tonumber(lease_ms)
if not n or n < 1 or n > 10000 or n % 1 ~= 0 or not lease or lease < 1 or lease % 1 ~= 0 then
  return redis.error_reply('EMQINPUT claim needs an integer count in [1, 10000] and an ' ..
    'integer lease >= 1 ms')
end
local grouped = #KEYS >= 13
local ring_head, cap_poll, quantum = 0, 0, 0
if #KEYS > 8 then
  ring_head, cap_poll, quantum = tonumber(ready_groups), tonumber(cap_recheck_ms),
    tonumber(per_turn)
  if not grouped or 2 * (#ARGV - 8) ~= #KEYS - 13 or not ring_head or ring_head < 1
      or not cap_poll or cap_poll < 1 or not quantum or quantum < 1 then
    return redis.error_reply('EMQINPUT claim needs ring, gactive, glimit, grate, claim record, ' ..
      'group settings, a request id and a lane and rate key per group name')
  end
end
if #ARGV > 8 then
  -- Capped groups are counted with the lex commands: touch each once, harmlessly, before
  -- the first write, so a user whose ACL lacks one fails here with nothing popped.
  redis.call('ZLEXCOUNT', gactive_key, '-', '-')
  redis.call('ZRANGEBYLEX', gactive_key, '-', '-')
end
-- The keys written after the pop (a job popped must get its lease), by type: a key of
-- another type there would fail the script with the jobs popped and leased to nobody.
local wrong = emq_key_type_error(active_key, 'zset') or emq_key_type_error(leases_key, 'hash')
  or emq_key_type_error(marker_key, 'zset')
if wrong then return redis.error_reply(wrong) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end

local now = emq_now()
local head = redis.call('ZRANGE', delayed_key, 0, 0, 'WITHSCORES')
local next_due = -1
if head[2] then next_due = emq_unpack_delayed(head[2]) end

local out = {now, 1, next_due}
-- The reply, with the next ready groups appended when the caller serves groups.
local function finish()
  if grouped then out[#out + 1] = emq_ring_head(ring_key, ring_head) end
  return out
end
-- Lease tokens are the worker id and one fencing number of the counter.
local function token_of(seq)
  -- ('%d' prints an integer as one: Lua's own number to text goes through '%.14g', a
  -- float print per job; exact below 2^53, where the counter stays)
  return string.format('%s:%d', worker_id, seq)
end
-- token_of for a batch's consecutive numbers, without a print per job (a string.format costs
-- as much as the rest of a job's lease): past 999 a number's text is the text of its
-- thousands, printed once per thousand, and its last three digits, joined from a table.
local EMQ_DIGIT = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9'}
local function token_maker()
  local thousands, head = -1, nil
  return function(seq)
    if seq < 1000 then return token_of(seq) end
    local low = seq % 1000
    local t = (seq - low) / 1000
    if t ~= thousands then thousands, head = t, token_of(t) end
    local units = low % 10
    local tens = (low - units) / 10 % 10
    return head .. EMQ_DIGIT[(low - low % 100) / 100 + 1] .. EMQ_DIGIT[tens + 1] ..
      EMQ_DIGIT[units + 1]
  end
end

-- A re-sent claim (its reply was lost) pops nothing: when `rid` is the id of the worker's
-- last claim, put the pairs its first send leased and this worker still holds in the
-- reply and return true.
local function resent(rid)
  local rec = redis.call('HMGET', record_key, 'rid', 'ids', 'last')
  if rec[1] ~= rid then return false end
  local ids = cmsgpack.unpack(rec[2])
  local last, count = tonumber(rec[3]), #ids
  for s = 1, count, 4000 do  -- (chunks: Lua's unpack() has a stack limit)
    local held = redis.call('HMGET', leases_key, unpack(ids, s, math.min(s + 3999, count)))
    for j, v in ipairs(held) do
      local token = token_of(last - count + s + j - 1)
      if v == token then
        out[#out + 1] = ids[s + j - 1]
        out[#out + 1] = token
      end
    end
  end
  return true
end
local rid = grouped and request_id or ''
if rid ~= '' and resent(rid) then return finish() end
if redis.call('HGET', meta_key, 'paused') == '1' then
  out[2] = 0
  return finish()
end

-- The queue's rate window (includes/rate.lua): the jobs claimed in the last `window` ms.
local f = redis.call('HMGET', meta_key, 'rate_max', 'rate_window')
local rate_max, window = emq_rate_spec(f[1], f[2])
local limited = rate_max ~= nil
local room = n
if limited then room = emq_window_room(rate_key, rate_max, window, now) end
-- The queue's window is full: when jobs wait, blocked workers wake when it opens (its
-- oldest claim leaves it, so one more job may be claimed): no polling.
local function window_full()
  if redis.call('ZCARD', pending_key) > 0 or (grouped and redis.call('ZCARD', ring_key) > 0) then
    local open = emq_window_opens(rate_key, window, now)
    emq_wake_at(marker_key, open)
    out[2] = 2
    if next_due == -1 or open < next_due then out[3] = open end
  end
  return finish()
end
if room <= 0 then return window_full() end

-- A grouped claim's pop (includes/turns.lua): parked groups whose re-check has come
-- rejoin, then the flat set and the named lanes are served in turn order. Returns the
-- serving state (popped, rated, rate_open) and whether ready lanes went unnamed.
local function take_grouped(want)
  emq_ring_unpark_due(ring_key, now)
  local lanes = {}
  for i = 14, #KEYS, 2 do lanes[#lanes + 1] = {k = i, r = i + 1, g = ARGV[9 + (i - 14) / 2]} end
  local sources, flat, passed = emq_turn_sources(ring_key, meta_key, 1, lanes)
  -- No lane named yet (a worker's first claim) while groups wait: the flat set takes only
  -- its turn, so the reply can name the lanes to serve next.
  local t = {now = now, want = want, quantum = quantum, cap_poll = cap_poll, popped = {},
             rated = {}, flat_only = #sources == 1 and emq_ring_live(ring_key)}
  emq_turn_serve(t, sources, ring_key, gactive_key, glimit_key, grate_key, leases_key)
  emq_turn_rotate(sources, flat, ring_key, meta_key)
  return t, emq_turn_unnamed(ring_key, ring_head, passed)
end

-- Nothing claimed: come back at once when live lanes this claim did not try wait; else,
-- when only parked groups hold jobs back (full windows, caps), sleep on the marker until
-- the first re-check (a freed slot wakes it sooner).
local function nothing_claimed(unpassed, rate_open)
  if unpassed then
    out[3] = now
  elseif grouped then
    local recheck, windowed = emq_ring_parked_next(ring_key)
    if recheck then
      emq_wake_at(marker_key, recheck)
      -- a window holds jobs back: rate limited (run_until_idle waits); caps: as before
      if rate_open or windowed then out[2] = 2 end
      if out[3] == -1 or recheck < out[3] then out[3] = recheck end
    end
  end
  return finish()
end

local want = math.min(n, room)
local popped, rated, rate_open, unpassed = nil, {}, nil, false
if not grouped then
  popped = emq_pop_lowest(pending_key, want)
else
  local t
  t, unpassed = take_grouped(want)
  popped, rated, rate_open = t.popped, t.rated, t.rate_open
end
local count = #popped
if count == 0 then return nothing_claimed(unpassed, rate_open) end

-- Leases and deadlines are looked up by job id in every later move (start, complete, reap,
-- fail). Redis keeps a small hash (up to 512 fields by default) or zset (128) as a
-- listpack, which every lookup and insert scans from its head: with a Worker's few hundred
-- leases in flight those scans cost more Redis CPU than the rest of a job's lifecycle. One
-- member longer than the listpack value limit (64 bytes by default) turns the leases hash
-- and the active zset into a hash table and a skiplist, which Redis keeps until the key is
-- emptied; it is written before a batch's leases and removed right after them, inside this
-- script, so no reader ever sees it (the stored data is unchanged, only its encoding). Not
-- for small claims: a few leases scan fast, and the two extra writes would cost more.
local EMQ_HASHED_FROM = 8
local EMQ_HASHED_MEMBER = 'emq:encoding:' .. string.rep('-', 115)  -- 128 bytes, never an id

-- Lease the popped jobs (drawing tokens last - count + 1 .. last): a deadline in active, a
-- token in leases and, when limited, a member of the queue's window each; their id/token
-- pairs go into the reply. Returns their ids.
local function lease_popped(last)
  -- (numbers as text made once: Redis prints a number argument of redis.call with
  -- snprintf("%.17g"), a cost per job when a shared number goes in per job)
  local deadline, at = emq_int(now + lease), emq_int(now)
  local zargs, hargs, rargs = {}, {}, {}
  local token_for = token_maker()
  local base = #out
  for i = 1, count do
    local id = popped[i]
    local token = token_for(last - count + i)
    local k = 2 * i  -- (indexes, not #t: a length is a search per use)
    zargs[k - 1], zargs[k] = deadline, id
    hargs[k - 1], hargs[k] = id, token
    if limited then rargs[k - 1], rargs[k] = at, token end
    out[base + k - 1], out[base + k] = id, token
  end
  local hashed = count >= EMQ_HASHED_FROM
  if hashed then
    redis.call('HSET', leases_key, EMQ_HASHED_MEMBER, '1')
    redis.call('ZADD', active_key, 0, EMQ_HASHED_MEMBER)
  end
  -- (chunks of 2,000 pairs: Lua's unpack() fails past ~8,000 values, and it must never
  -- fail here, after the pop)
  for s = 1, #zargs, 4000 do
    local e = math.min(s + 3999, #zargs)
    redis.call('ZADD', active_key, unpack(zargs, s, e))
    redis.call('HSET', leases_key, unpack(hargs, s, e))
    if limited then redis.call('ZADD', rate_key, unpack(rargs, s, e)) end
  end
  if hashed then
    redis.call('HDEL', leases_key, EMQ_HASHED_MEMBER)
    redis.call('ZREM', active_key, EMQ_HASHED_MEMBER)
  end
  return popped
end

-- Each rate-limited group's window counts its claims too (same token -> instant pairs).
local function count_in_group_windows()
  local touched = {}
  for i, s in pairs(rated) do
    redis.call('ZADD', KEYS[s.r], now, out[3 + 2 * i])
    touched[s] = true
  end
  for s in pairs(touched) do redis.call('PEXPIRE', KEYS[s.r], s.gwin) end
end

-- More work left: pass the wake-up on to the next idle worker (or, the window now full,
-- have it woken when the window opens).
local function pass_wake_on()
  local more = redis.call('ZCARD', pending_key) > 0
  if grouped and not more then
    more = (count == want or unpassed) and emq_ring_live(ring_key)
  end
  if more then
    if limited and room - count <= 0 then
      emq_wake_at(marker_key, emq_window_opens(rate_key, window, now))
    else
      emq_wake(marker_key)
    end
  end
end

-- One counter draw for the whole batch: tokens are unique fencing numbers.
local last = redis.call('INCRBY', counter_key, count)
local ids = lease_popped(last)
if limited then
  redis.call('PEXPIRE', rate_key, window)  -- nothing outlives the window it counts for
end
if rid ~= '' then
  -- what a re-send of this very claim hands back (see resent()); gone with the leases
  redis.call('HSET', record_key, 'rid', rid, 'ids', cmsgpack.pack(ids), 'last', last)
  redis.call('PEXPIRE', record_key, lease)
end
count_in_group_windows()
pass_wake_on()
return finish()
