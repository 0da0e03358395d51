-- due.lua: read-only: the ids whose time has come on the server clock, so the
-- caller can declare their job keys to promote.lua / reap.lua.
--
-- KEYS[1] zset: emq:{q}:delayed (packed run-at scores) or emq:{q}:active (lease deadlines)
-- ARGV[1] max ids to return
-- ARGV[2] '1' when KEYS[1] holds packed delayed scores, '0' for plain ms scores
-- Returns: {now_ms, id1, id2, ...} oldest first
-- Errors:  EMQINPUT bad limit
--@include common

local limit = tonumber(ARGV[1])
if not limit or limit < 1 then
  return redis.error_reply('EMQINPUT limit must be >= 1')
end
local now = emq_now()
local bound = now
if ARGV[2] == '1' then bound = emq_due_bound(now) end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', bound, 'LIMIT', 0, limit)
table.insert(ids, 1, now)
return ids
