-- claim.lua: lease up to N pending jobs to one worker (lowest score first).
-- Phase one of taking work: it pops ids and records their leases without
-- touching job hashes (their keys are unknown until the pop); start.lua then
-- stamps each claimed job, with its key declared. A queue-wide rate limit (meta
-- 'rate_max' jobs per 'rate_window' ms, set by configure.lua) caps how many jobs
-- are claimed in any sliding window on the server clock. With the optional group
-- keys it also serves group lanes: one job per ready group per turn, the flat pending set
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
-- ARGV[1] max jobs to claim (>= 1)
-- ARGV[2] lease length ms
-- ARGV[3] worker id (prefix of the lease tokens)
-- KEYS[9..] optional group keys: KEYS[9] groups ring zset emq:{q}:groups, KEYS[10] gactive zset emq:{q}:gactive, KEYS[11] glimit hash emq:{q}:glimit, KEYS[12] grate hash emq:{q}:grate, KEYS[13] the worker's claim record hash emq:{q}:w:<worker>:claim, then per group name ARGV[9..] two keys: its lane emq:{q}:g:<group>:pending and its rate zset emq:{q}:g:<group>:rate
-- ARGV[4] keyspace version of the caller
-- ARGV[5..] optional with the group keys: ARGV[5] ready groups to name in the reply, ARGV[6] ms until a group parked at its cap is re-checked (a freed slot unparks it sooner), ARGV[7] jobs per group per turn, ARGV[8] request id of this claim ('' = none; a claim re-sent with the id of the worker's last claim that leased jobs pops nothing and returns that claim's pairs still leased), then ARGV[9..] the group names of the lane/rate key pairs KEYS[14..] (from the previous claim's reply; re-checked)
-- Returns: {now_ms, status, next_due_ms, id1, token1, id2, token2, ...}, and with the group
--          keys one last element: the names of the next ready groups (ring head, ARGV[5] of them)
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
local rid = grouped and ARGV[8] or ''
if rid ~= '' then
  local rec = redis.call('HMGET', KEYS[13], 'rid', 'ids', 'last')
  if rec[1] == rid then
    -- A re-sent claim (its reply was lost): pop nothing, hand back what its first send
    -- leased and this worker still holds.
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
    return finish()
  end
end
if redis.call('HGET', KEYS[4], 'paused') == '1' then
  out[2] = 0
  return finish()
end

-- The rate window: members are the jobs claimed in the last rate_window ms.
local f = redis.call('HMGET', KEYS[4], 'rate_max', 'rate_window')
local rate_max, window = tonumber(f[1] or ''), tonumber(f[2] or '')
local limited = rate_max and window and rate_max > 0 and window > 0
local room = n
if limited then
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now - window)
  room = rate_max - redis.call('ZCARD', KEYS[8])
end
-- When the window's oldest claim leaves it, one more job may be claimed.
local function opens_at()
  local oldest = redis.call('ZRANGE', KEYS[8], 0, 0, 'WITHSCORES')
  return tonumber(oldest[2]) + window
end
if room <= 0 then
  if redis.call('ZCARD', KEYS[1]) > 0 or (grouped and redis.call('ZCARD', KEYS[9]) > 0) then
    local open = opens_at()
    emq_wake_at(KEYS[5], open)  -- blocked workers wake when the window opens: no polling
    out[2] = 2
    if next_due == -1 or open < next_due then out[3] = open end
  end
  return finish()
end

-- Room left in group g under its cap (nil cap: unlimited). Active jobs of capped groups
-- are members "<g>\0<id>" of gactive; one whose lease is gone (completed, failed,
-- released, reaped) is pruned here, so no finishing script needs the group's keys.
local function group_room(g, prune)
  local cap = tonumber(redis.call('HGET', KEYS[11], g) or '')
  if not cap then return nil end
  local lo, hi = '[' .. g .. '\0', '[' .. g .. '\0\255'
  local active = redis.call('ZLEXCOUNT', KEYS[10], lo, hi)
  if active >= cap and prune then
    for _, m in ipairs(redis.call('ZRANGEBYLEX', KEYS[10], lo, hi)) do
      if not redis.call('HGET', KEYS[3], string.sub(m, #g + 2)) then
        redis.call('ZREM', KEYS[10], m)
        active = active - 1
      end
    end
  end
  return cap - active
end

-- Room left in group g's own rate window (nil: no limit), and when it next opens.
-- rkey holds the group's claims of the last window (lease token -> claim instant).
local function group_rate_room(g, rkey)
  local spec = redis.call('HGET', KEYS[12], g)
  if not spec then return nil end
  local gmax, gwin = string.match(spec, '^(%d+):(%d+)$')
  gmax, gwin = tonumber(gmax), tonumber(gwin)
  if not gmax or not gwin or gmax < 1 or gwin < 1 then return nil end
  redis.call('ZREMRANGEBYSCORE', rkey, '-inf', now - gwin)
  local used = redis.call('ZCARD', rkey)
  local opens = now
  if used > 0 then
    opens = tonumber(redis.call('ZRANGE', rkey, 0, 0, 'WITHSCORES')[2]) + gwin
  end
  return gmax - used, opens, gwin
end

local want = math.min(n, room)
local popped, capped, unpassed = {}, false, false
local rate_open = nil        -- earliest opening of a group window that turned a group away
local rated = {}             -- per popped job (by index): its group's source when rate-limited
if not grouped then
  popped = redis.call('ZPOPMIN', KEYS[1], want)
else
  -- Parked groups whose re-check time has come (a window opened, a slot freed) rejoin.
  emq_ring_unpark_due(KEYS[9], now)
  -- Sources in turn order: the flat pending set counts as one more group, with its own
  -- turn in the ring's numbering (meta 'fturn'; never past the ring's back).
  local flat = {k = 1, g = false, turn = 0}  -- k: index of the source's key in KEYS
  local sources = {flat}
  local passed = {}
  for i = 14, #KEYS, 2 do
    local g = ARGV[9 + (i - 14) / 2]
    passed[g] = true
    local turn = tonumber(redis.call('ZSCORE', KEYS[9], g) or '')
    if turn and turn > 0 then
      sources[#sources + 1] = {k = i, r = i + 1, g = g, turn = turn, at = #sources}
    end
  end
  if #sources > 1 then
    flat.turn = math.min(tonumber(redis.call('HGET', KEYS[4], 'fturn') or '0'),
      emq_ring_back_turn(KEYS[9]))
    flat.at = 0
    table.sort(sources, function(a, b)
      if a.turn ~= b.turn then return a.turn < b.turn end
      return a.at < b.at  -- ties: the flat set first, then ring order
    end)
  end
  -- No lane named yet (a worker's first claim) while groups wait: the flat set takes only
  -- its turn, so the reply can name the lanes to serve next.
  local flat_turn_only = #sources == 1 and emq_ring_live(KEYS[9])
  local live = #sources
  local open = #sources  -- sources not yet empty or capped
  local first = true
  while #popped / 2 < want and live > 0 do
    live = 0
    for _, s in ipairs(sources) do
      if #popped / 2 >= want then break end
      if not s.done then
        local g = s.g
        local left = g and group_room(g, first)
        if g and s.rleft == nil then
          local rl, opens, gwin = group_rate_room(g, KEYS[s.r])
          s.rleft, s.opens, s.gwin = rl or false, opens, gwin
        end
        if left and left <= 0 then
          -- at its cap: parked off the ring until a slot frees (group_free.lua, group_join
          -- or the re-check after cap_poll ms), so ready groups are found past any number
          s.done, s.parked, capped, open = true, true, true, open - 1
          emq_ring_park(KEYS[9], g, now + cap_poll, true)
        elseif g and s.rleft and s.rleft <= 0 then
          -- its window is full: parked until it opens (no re-trying it before then)
          s.done, s.parked, open = true, true, open - 1
          emq_ring_park(KEYS[9], g, s.opens, false)
          if not rate_open or s.opens < rate_open then rate_open = s.opens end
        else
          -- the last open source takes the rest in one pop (the flat-only hot path)
          local turn = quantum
          if open == 1 and not flat_turn_only then turn = want end
          local take = math.min(turn, want - #popped / 2, left or turn, (g and s.rleft) or turn)
          local some = redis.call('ZPOPMIN', KEYS[s.k], take)
          for j = 1, #some, 2 do
            popped[#popped + 1], popped[#popped + 2] = some[j], some[j + 1]
            if left then redis.call('ZADD', KEYS[10], 0, g .. '\0' .. some[j]) end
            if g and s.rleft then rated[#popped / 2] = s end
          end
          if g and s.rleft then s.rleft = s.rleft - #some / 2 end
          if some[1] then
            s.served = true
            live = live + 1
            if flat_turn_only then s.done = true end  -- one turn: the lanes come next
          else
            s.done, open = true, open - 1
            if g then redis.call('ZREM', KEYS[9], g) end  -- empty lane leaves the ring
          end
        end
      end
    end
    first = false
  end
  -- Served groups go to the back of the ring: the next turn starts elsewhere. So does the
  -- flat set when it was served beside lanes (its turn is numbered like theirs).
  for _, s in ipairs(sources) do
    if s.g and s.served and not s.parked and redis.call('ZSCORE', KEYS[9], s.g) then
      emq_ring_back(KEYS[9], s.g, true)
    end
  end
  if flat.served and #sources > 1 then
    redis.call('HSET', KEYS[4], 'fturn', emq_ring_back_turn(KEYS[9]))
  end
  for _, g in ipairs(emq_ring_head(KEYS[9], ring_head)) do
    if not passed[g] then unpassed = true end
  end
end
local count = #popped / 2
if count == 0 then
  if unpassed then
    out[3] = now  -- live lanes this claim did not try: come back at once
  elseif grouped then
    -- only parked groups hold jobs back (full windows, caps): sleep on the marker until
    -- the first re-check (a freed slot wakes it sooner)
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

-- One counter draw for the whole batch: tokens are unique fencing numbers.
local last = redis.call('INCRBY', KEYS[7], count)
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
-- (chunks of 2,000 pairs: Lua's unpack() fails past ~8,000 values, and it must never fail
-- here, after the pop)
for s = 1, #zargs, 4000 do
  local e = math.min(s + 3999, #zargs)
  redis.call('ZADD', KEYS[2], unpack(zargs, s, e))
  redis.call('HSET', KEYS[3], unpack(hargs, s, e))
  if limited then redis.call('ZADD', KEYS[8], unpack(rargs, s, e)) end
end
if limited then
  redis.call('PEXPIRE', KEYS[8], window)  -- nothing outlives the window it counts for
end
if rid ~= '' then
  -- what a re-send of this very claim hands back (see above); gone with the leases
  redis.call('HSET', KEYS[13], 'rid', rid, 'ids', cmsgpack.pack(ids), 'last', last)
  redis.call('PEXPIRE', KEYS[13], lease)
end
-- Each rate-limited group's window counts its claims too (same token -> instant pairs).
local touched = {}
for i, s in pairs(rated) do
  redis.call('ZADD', KEYS[s.r], now, out[3 + 2 * i])
  touched[s] = true
end
for s in pairs(touched) do redis.call('PEXPIRE', KEYS[s.r], s.gwin) end
-- More work left: pass the wake-up on to the next idle worker (or, the window
-- now full, have it woken when the window opens).
local more = redis.call('ZCARD', KEYS[1]) > 0
if grouped and not more then
  more = (count == want or unpassed) and emq_ring_live(KEYS[9])
end
if more then
  if limited and room - count <= 0 then
    emq_wake_at(KEYS[5], opens_at())
  else
    emq_wake(KEYS[5])
  end
end
return finish()
