-- includes/rate.lua: sliding rate windows, shared by claim.lua and start.lua. Needs
-- common.lua. A window is a zset of lease token -> instant (server ms): the queue's
-- emq:{q}:rate (meta 'rate_max' per 'rate_window' ms) and each group's
-- emq:{q}:g:<group>:rate (grate hash: group -> "max:window"). claim.lua counts a claim in
-- it; start.lua moves the member to the start instant (or adds it when the claim has left
-- the window), so a window holds every claim or start of its last `span` ms.
-- Only reads and the writes named below: the callers decide when a window may be written.

-- The queue-wide limit from meta's 'rate_max' and 'rate_window' fields (as the caller's
-- HMGET read them): max jobs and window ms, or nil when no limit is set.
local function emq_rate_spec(max_field, span_field)
  local max, span = tonumber(max_field or ''), tonumber(span_field or '')
  if max and span and max > 0 and span > 0 then return max, span end
  return nil
end

-- Group `group`'s limit from the grate hash: max jobs and window ms, or nil when the
-- group has none (or a malformed one, which counts as none).
local function emq_group_rate_spec(grate, group)
  local spec = redis.call('HGET', grate, group)
  local max, span = string.match(spec or '', '^(%d+):(%d+)$')
  max, span = tonumber(max), tonumber(span)
  if max and span and max >= 1 and span >= 1 then return max, span end
  return nil
end

-- Drop the members that left window `wkey` (older than `span` ms before `now`). A write:
-- callers prune only once their checks are done.
local function emq_window_prune(wkey, now, span)
  redis.call('ZREMRANGEBYSCORE', wkey, '-inf', now - span)
end

-- When window `wkey` next opens: its oldest member's instant + `span` (`now` + `span`
-- when it is empty).
local function emq_window_opens(wkey, span, now)
  local oldest = redis.call('ZRANGE', wkey, 0, 0, 'WITHSCORES')
  return tonumber(oldest[2] or now) + span
end

-- Room left in window `wkey` of `max` per `span` ms, pruned first.
local function emq_window_room(wkey, max, span, now)
  emq_window_prune(wkey, now, span)
  return max - redis.call('ZCARD', wkey)
end

-- Group `group`'s window (rate zset `rkey`), pruned: room left, the instant it next
-- opens (`now` while it is empty) and its span; nil when the group has no limit.
local function emq_group_window_room(grate, group, rkey, now)
  local max, span = emq_group_rate_spec(grate, group)
  if not max then return nil end
  emq_window_prune(rkey, now, span)
  local used = redis.call('ZCARD', rkey)
  local opens = now
  if used > 0 then opens = emq_window_opens(rkey, span, now) end
  return max - used, opens, span
end

-- Whether `token`'s start fits window `wkey` of `max`: it holds a place already (its
-- claim is still in the window), or there is room.
local function emq_window_fits(wkey, max, token)
  return redis.call('ZSCORE', wkey, token) or redis.call('ZCARD', wkey) < max
end

-- Record `token` in window `wkey` at `now`; nothing outlives the window it counts for.
local function emq_window_record(wkey, span, token, now)
  redis.call('ZADD', wkey, now, token)
  redis.call('PEXPIRE', wkey, span)
end
