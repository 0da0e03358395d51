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
-- KEYS[1] pending zset   emq:{q}:pending
-- KEYS[2] active zset    emq:{q}:active   (score = lease deadline, server ms)
-- KEYS[3] leases hash    emq:{q}:leases   (job id -> lease token)
-- KEYS[4] meta hash      emq:{q}:meta
-- KEYS[5] marker zset    emq:{q}:marker
-- KEYS[6] delayed zset   emq:{q}:delayed
-- KEYS[7] counter        emq:{q}:counter
-- KEYS[8] rate zset      emq:{q}:rate     (lease token -> claim instant, last window only)
-- KEYS[9..] optional group keys: KEYS[9] groups ring zset emq:{q}:groups,
--          KEYS[10] gactive zset emq:{q}:gactive, KEYS[11] glimit hash emq:{q}:glimit,
--          KEYS[12] grate hash emq:{q}:grate, KEYS[13] the worker's claim record hash
--          emq:{q}:w:<worker>:claim, then per group name ARGV[9..] two keys: its lane
--          emq:{q}:g:<group>:pending and its rate zset emq:{q}:g:<group>:rate
-- ARGV[1] max jobs to claim (>= 1)
-- ARGV[2] lease length ms
-- ARGV[3] worker id (prefix of the lease tokens)
-- ARGV[4] keyspace version of the caller
-- ARGV[5..] optional with the group keys: ARGV[5] ready groups to name in the reply,
--          ARGV[6] ms until a group parked at its cap is re-checked (a freed slot unparks
--          it sooner), ARGV[7] jobs per group per turn, ARGV[8] request id of this claim
--          ('' = none; a claim re-sent with the id of the worker's last claim that leased
--          jobs pops nothing and returns that claim's pairs still leased), then ARGV[9..]
--          the group names of the lane/rate key pairs KEYS[14..] (from the previous
--          claim's reply; re-checked)
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
--          EMQVERSION keyspace of another major version
--@include common
--@include groups
--@include rate
--@include turns

local n = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
if not n or n < 1 or n > 10000 or n % 1 ~= 0 or not lease or lease < 1 or lease % 1 ~= 0 then
  return redis.error_reply('EMQINPUT claim needs an integer count in [1, 10000] and an ' ..
    'integer lease >= 1 ms')
end
local grouped = #KEYS >= 13
local ring_head, cap_poll, quantum = 0, 0, 0
if #KEYS > 8 then
  ring_head, cap_poll, quantum = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  if not grouped or 2 * (#ARGV - 8) ~= #KEYS - 13 or not ring_head or ring_head < 1
      or not cap_poll or cap_poll < 1 or not quantum or quantum < 1 then
    return redis.error_reply('EMQINPUT claim needs ring, gactive, glimit, grate, claim record, ' ..
      'group settings, a request id and a lane and rate key per group name')
  end
end
if #ARGV > 8 then
  -- Capped groups are counted with the lex commands: touch each once, harmlessly, before
  -- the first write, so a user whose ACL lacks one fails here with nothing popped.
  redis.call('ZLEXCOUNT', KEYS[10], '-', '-')
  redis.call('ZRANGEBYLEX', KEYS[10], '-', '-')
end
local err = emq_fence(KEYS[4], ARGV[4])
if err then return redis.error_reply(err) end

local now = emq_now()
local head = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
local next_due = -1
if head[2] then next_due = emq_unpack_delayed(head[2]) end

local out = {now, 1, next_due}
-- The reply, with the next ready groups appended when the caller serves groups.
local function finish()
  if grouped then out[#out + 1] = emq_ring_head(KEYS[9], ring_head) end
  return out
end
-- Lease tokens are the worker id and one fencing number of the counter.
local function token_of(seq)
  -- (Lua prints integers below 1e14 exactly; emq_int's string.format only past that)
  return ARGV[3] .. ':' .. (seq < 1e14 and seq or emq_int(seq))
end

-- A re-sent claim (its reply was lost) pops nothing: when `rid` is the id of the worker's
-- last claim, put the pairs its first send leased and this worker still holds in the
-- reply and return true.
local function resent(rid)
  local rec = redis.call('HMGET', KEYS[13], 'rid', 'ids', 'last')
  if rec[1] ~= rid then return false end
  local ids = cmsgpack.unpack(rec[2])
  local last, count = tonumber(rec[3]), #ids
  for s = 1, count, 4000 do  -- (chunks: Lua's unpack() has a stack limit)
    local held = redis.call('HMGET', KEYS[3], unpack(ids, s, math.min(s + 3999, count)))
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
local rid = grouped and ARGV[8] or ''
if rid ~= '' and resent(rid) then return finish() end
if redis.call('HGET', KEYS[4], 'paused') == '1' then
  out[2] = 0
  return finish()
end

-- The queue's rate window (includes/rate.lua): the jobs claimed in the last `window` ms.
local f = redis.call('HMGET', KEYS[4], 'rate_max', 'rate_window')
local rate_max, window = emq_rate_spec(f[1], f[2])
local limited = rate_max ~= nil
local room = n
if limited then room = emq_window_room(KEYS[8], rate_max, window, now) end
-- The queue's window is full: when jobs wait, blocked workers wake when it opens (its
-- oldest claim leaves it, so one more job may be claimed): no polling.
local function window_full()
  if redis.call('ZCARD', KEYS[1]) > 0 or (grouped and redis.call('ZCARD', KEYS[9]) > 0) then
    local open = emq_window_opens(KEYS[8], window, now)
    emq_wake_at(KEYS[5], open)
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
  emq_ring_unpark_due(KEYS[9], now)
  local lanes = {}
  for i = 14, #KEYS, 2 do lanes[#lanes + 1] = {k = i, r = i + 1, g = ARGV[9 + (i - 14) / 2]} end
  local sources, flat, passed = emq_turn_sources(KEYS[9], KEYS[4], 1, lanes)
  -- No lane named yet (a worker's first claim) while groups wait: the flat set takes only
  -- its turn, so the reply can name the lanes to serve next.
  local t = {now = now, want = want, quantum = quantum, cap_poll = cap_poll, popped = {},
             rated = {}, flat_only = #sources == 1 and emq_ring_live(KEYS[9])}
  emq_turn_serve(t, sources, KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[3])
  emq_turn_rotate(sources, flat, KEYS[9], KEYS[4])
  return t, emq_turn_unnamed(KEYS[9], ring_head, passed)
end

-- Nothing claimed: come back at once when live lanes this claim did not try wait; else,
-- when only parked groups hold jobs back (full windows, caps), sleep on the marker until
-- the first re-check (a freed slot wakes it sooner).
local function nothing_claimed(unpassed, rate_open)
  if unpassed then
    out[3] = now
  elseif grouped then
    local recheck, windowed = emq_ring_parked_next(KEYS[9])
    if recheck then
      emq_wake_at(KEYS[5], recheck)
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
  popped = redis.call('ZPOPMIN', KEYS[1], want)
else
  local t
  t, unpassed = take_grouped(want)
  popped, rated, rate_open = t.popped, t.rated, t.rate_open
end
local count = #popped / 2
if count == 0 then return nothing_claimed(unpassed, rate_open) end

-- Lease the popped jobs (drawing tokens last - count + 1 .. last): a deadline in active, a
-- token in leases and, when limited, a member of the queue's window each; their id/token
-- pairs go into the reply. Returns their ids.
local function lease_popped(last)
  local deadline = now + lease
  local zargs, hargs, rargs, ids = {}, {}, {}, {}
  for i = 1, count do
    local id = popped[2 * i - 1]
    local token = token_of(last - count + i)
    zargs[#zargs + 1] = deadline
    zargs[#zargs + 1] = id
    hargs[#hargs + 1] = id
    hargs[#hargs + 1] = token
    if limited then
      rargs[#rargs + 1] = now
      rargs[#rargs + 1] = token
    end
    ids[i] = id
    out[#out + 1] = id
    out[#out + 1] = token
  end
  -- (chunks of 2,000 pairs: Lua's unpack() fails past ~8,000 values, and it must never
  -- fail here, after the pop)
  for s = 1, #zargs, 4000 do
    local e = math.min(s + 3999, #zargs)
    redis.call('ZADD', KEYS[2], unpack(zargs, s, e))
    redis.call('HSET', KEYS[3], unpack(hargs, s, e))
    if limited then redis.call('ZADD', KEYS[8], unpack(rargs, s, e)) end
  end
  return ids
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
  local more = redis.call('ZCARD', KEYS[1]) > 0
  if grouped and not more then
    more = (count == want or unpassed) and emq_ring_live(KEYS[9])
  end
  if more then
    if limited and room - count <= 0 then
      emq_wake_at(KEYS[5], emq_window_opens(KEYS[8], window, now))
    else
      emq_wake(KEYS[5])
    end
  end
end

-- One counter draw for the whole batch: tokens are unique fencing numbers.
local last = redis.call('INCRBY', KEYS[7], count)
local ids = lease_popped(last)
if limited then
  redis.call('PEXPIRE', KEYS[8], window)  -- nothing outlives the window it counts for
end
if rid ~= '' then
  -- what a re-send of this very claim hands back (see resent()); gone with the leases
  redis.call('HSET', KEYS[13], 'rid', rid, 'ids', cmsgpack.pack(ids), 'last', last)
  redis.call('PEXPIRE', KEYS[13], lease)
end
count_in_group_windows()
pass_wake_on()
return finish()
