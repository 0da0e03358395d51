-- includes/groups.lua: the ring of ready groups (group lanes). Needs nothing else.
-- The ring is a zset of group names whose lanes hold waiting jobs; a positive score is the
-- group's turn: claim.lua serves the lowest first and sends a served group to the back.
-- A group that cannot be served now is PARKED on the ring with a negative score,
-- -(the server ms at which to re-check it): a full rate window (re-check when it opens,
-- a whole ms) or a reached concurrency cap (re-check at ms + 0.5, or sooner: a freed slot
-- unparks it, group_free.lua / group_join.lua). Parked groups stay members (counts and
-- lists see every lane) but are out of the turn order, so claims skip them for free.

-- The turn a group sent to the back of the ring gets (parked members do not count).
local function emq_ring_back_turn(ring)
  local last = redis.call('ZRANGE', ring, -1, -1, 'WITHSCORES')
  local turn = 1
  if last[2] and tonumber(last[2]) > 0 then turn = tonumber(last[2]) + 1 end
  return turn
end

-- Put `group` at the back of the ring (re-score it when `rotate`, else only if absent).
local function emq_ring_back(ring, group, rotate)
  local turn = emq_ring_back_turn(ring)
  if rotate then
    redis.call('ZADD', ring, turn, group)
  else
    redis.call('ZADD', ring, 'NX', turn, group)
  end
end

-- The first `n` groups in turn order (parked ones left out).
local function emq_ring_head(ring, n)
  return redis.call('ZRANGEBYSCORE', ring, '(0', '+inf', 'LIMIT', 0, n)
end

-- True when some group is in the turn order (not parked).
local function emq_ring_live(ring)
  return redis.call('ZRANGEBYSCORE', ring, '(0', '+inf', 'LIMIT', 0, 1)[1] ~= nil
end

-- Park `group` until server ms `at` (`capped`: a cap, not a window, holds it).
local function emq_ring_park(ring, group, at, capped)
  if capped then at = at + 0.5 end
  redis.call('ZADD', ring, -at, group)
end

-- Parked groups due for their re-check at `now` rejoin the back of the turn order
-- (at most 100 per call: bounded work; the rest on the next claim).
local function emq_ring_unpark_due(ring, now)
  for _, g in ipairs(redis.call('ZRANGEBYSCORE', ring, -(now + 0.5), '(0', 'LIMIT', 0, 100)) do
    emq_ring_back(ring, g, true)
  end
end

-- A parked group back on the turn order (a freed slot, new work moved in): true when it
-- was parked (`capped_only`: parked at its cap, not by a window). Live or absent groups
-- are left alone.
local function emq_ring_unpark(ring, group, capped_only)
  local score = tonumber(redis.call('ZSCORE', ring, group) or '')
  if score and score < 0 and (not capped_only or score % 1 ~= 0) then
    emq_ring_back(ring, group, true)
    return true
  end
  return false
end

-- The earliest re-check among parked groups: (server ms, true when a window holds it), or nil.
local function emq_ring_parked_next(ring)
  local head = redis.call('ZREVRANGEBYSCORE', ring, '(0', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if not head[2] then return nil end
  local at = -tonumber(head[2])
  return math.floor(at), at % 1 == 0
end
