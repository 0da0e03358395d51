-- includes/groups.lua: the ring of ready groups (group lanes). Needs nothing else.
-- The ring is a zset of group names whose lanes hold waiting jobs; the score is the
-- group's turn: claim.lua serves the lowest first and sends a served group to the back.

-- Put `group` at the back of the ring (re-score it when `rotate`, else only if absent).
local function emq_ring_back(ring, group, rotate)
  local last = redis.call('ZRANGE', ring, -1, -1, 'WITHSCORES')
  local turn = 1
  if last[2] then turn = tonumber(last[2]) + 1 end
  if rotate then
    redis.call('ZADD', ring, turn, group)
  else
    redis.call('ZADD', ring, 'NX', turn, group)
  end
end
