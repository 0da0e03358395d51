-- includes/turns.lua: a grouped claim's turn over the group lanes (claim.lua). Needs
-- common.lua, groups.lua and rate.lua.
-- A source is the flat pending set or one group's lane: {k = index of its zset in KEYS,
-- r = index of its rate zset in KEYS (lanes only), g = group name (false: the flat set),
-- turn = its ring score, at = its place for ties}. Sources are served in turn order, up
-- to `quantum` jobs each per round, round after round until the claim is full or every
-- source is done (empty, parked at its cap or with a full window, or served its one turn).
-- The serving state `t`: {now, want = jobs wanted, quantum, cap_poll = ms until a capped
-- group's re-check, flat_only = the flat set takes one turn only, popped = {id, ...},
-- rated = {[job index] = its rate-limited source}, rate_open = earliest opening of a window
-- that turned a group away, open = sources not done, live = sources served this round,
-- first = in the first round}.

-- Room left in group g under its cap (nil cap: unlimited). Active jobs of capped groups
-- are members "<g>\0<id>" of gactive; one whose lease is gone (completed, failed,
-- released, reaped) is pruned here when `prune`, so no finishing script needs the group's
-- keys (group_free.lua keeps it exact; this is the fallback for expired leases).
local function emq_group_room(glimit, gactive, leases, g, prune)
  local cap = tonumber(redis.call('HGET', glimit, g) or '')
  if not cap then return nil end
  local lo, hi = '[' .. g .. '\0', '[' .. g .. '\0\255'
  local active = redis.call('ZLEXCOUNT', gactive, lo, hi)
  if active >= cap and prune then
    for _, m in ipairs(redis.call('ZRANGEBYLEX', gactive, lo, hi)) do
      if not redis.call('HGET', leases, string.sub(m, #g + 2)) then
        redis.call('ZREM', gactive, m)
        active = active - 1
      end
    end
  end
  return cap - active
end

-- The sources of one claim in turn order: the flat set (its zset KEYS[flat_k]; its turn is
-- meta 'fturn', never past the ring's back) and each lane of `lanes` ({k, r, g} each, the
-- groups the caller named) whose group is in the turn order. Returns the sources, the flat
-- source and the set of named groups.
local function emq_turn_sources(ring, meta, flat_k, lanes)
  local flat = {k = flat_k, g = false, turn = 0}
  local sources, passed = {flat}, {}
  for _, lane in ipairs(lanes) do
    local g = lane.g
    passed[g] = true
    local turn = tonumber(redis.call('ZSCORE', ring, g) or '')
    if turn and turn > 0 then
      sources[#sources + 1] = {k = lane.k, r = lane.r, g = g, turn = turn, at = #sources}
    end
  end
  if #sources > 1 then
    flat.turn = math.min(tonumber(redis.call('HGET', meta, 'fturn') or '0'),
      emq_ring_back_turn(ring))
    flat.at = 0
    table.sort(sources, function(a, b)
      if a.turn ~= b.turn then return a.turn < b.turn end
      return a.at < b.at  -- ties: the flat set first, then ring order
    end)
  end
  return sources, flat, passed
end

-- Whether source s is held back now: a group at its cap is parked until a slot frees
-- (group_free.lua, group_join.lua or the re-check after cap_poll ms), one whose window is
-- full until it opens, so ready groups are found past any number of them. Returns true
-- when held, else false and the group's cap room (falsy: no cap, or the flat set).
local function emq_turn_held(t, s, ring, gactive, glimit, grate, leases)
  local g = s.g
  local left = g and emq_group_room(glimit, gactive, leases, g, t.first)
  if g and s.rleft == nil then
    local rl, opens, span = emq_group_window_room(grate, g, KEYS[s.r], t.now)
    s.rleft, s.opens, s.gwin = rl or false, opens, span
  end
  if left and left <= 0 then
    s.done, s.parked, t.open = true, true, t.open - 1
    emq_ring_park(ring, g, t.now + t.cap_poll, true)
    return true
  elseif g and s.rleft and s.rleft <= 0 then
    s.done, s.parked, t.open = true, true, t.open - 1
    emq_ring_park(ring, g, s.opens, false)
    if not t.rate_open or s.opens < t.rate_open then t.rate_open = s.opens end
    return true
  end
  return false, left
end

-- Pop source s's share of this round into t.popped (`left`: its cap room, falsy when
-- none); a capped group's jobs join gactive. An empty lane leaves the ring.
local function emq_turn_pop(t, s, left, ring, gactive)
  local g = s.g
  -- the last open source takes the rest in one pop (the flat-only hot path)
  local turn = t.quantum
  if t.open == 1 and not t.flat_only then turn = t.want end
  local popped = t.popped
  local take = math.min(turn, t.want - #popped, left or turn, (g and s.rleft) or turn)
  local some = emq_pop_lowest(KEYS[s.k], take)
  for j = 1, #some do
    popped[#popped + 1] = some[j]
    if left then redis.call('ZADD', gactive, 0, g .. '\0' .. some[j]) end
    if g and s.rleft then t.rated[#popped] = s end
  end
  if g and s.rleft then s.rleft = s.rleft - #some end
  if some[1] then
    s.served = true
    t.live = t.live + 1
    if t.flat_only then s.done = true end  -- one turn: the lanes come next
  else
    s.done, t.open = true, t.open - 1
    if g then redis.call('ZREM', ring, g) end
  end
end

-- Serve the sources round after round until t.want jobs are popped or none is left.
local function emq_turn_serve(t, sources, ring, gactive, glimit, grate, leases)
  t.live, t.open, t.first = #sources, #sources, true
  while #t.popped < t.want and t.live > 0 do
    t.live = 0
    for _, s in ipairs(sources) do
      if #t.popped >= t.want then break end
      if not s.done then
        local held, left = emq_turn_held(t, s, ring, gactive, glimit, grate, leases)
        if not held then emq_turn_pop(t, s, left, ring, gactive) end
      end
    end
    t.first = false
  end
end

-- Served groups go to the back of the ring: the next turn starts elsewhere. So does the
-- flat set when it was served beside lanes (its turn is numbered like theirs).
local function emq_turn_rotate(sources, flat, ring, meta)
  for _, s in ipairs(sources) do
    if s.g and s.served and not s.parked and redis.call('ZSCORE', ring, s.g) then
      emq_ring_back(ring, s.g, true)
    end
  end
  if flat.served and #sources > 1 then
    redis.call('HSET', meta, 'fturn', emq_ring_back_turn(ring))
  end
end

-- True when the ring's next `n` ready groups include one the claim was not told about
-- (not in the set `passed`).
local function emq_turn_unnamed(ring, n, passed)
  for _, g in ipairs(emq_ring_head(ring, n)) do
    if not passed[g] then return true end
  end
  return false
end
