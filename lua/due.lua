-- due.lua: read-only: the ids whose time has come on the server clock, so the
-- caller can declare their job keys to promote.lua / reap.lua.
--
-- KEYS[1] zset: emq:{q}:delayed (packed run-at scores) or emq:{q}:active (lease deadlines)
-- KEYS[2..] optional: KEYS[2] meta hash emq:{q}:meta; then the reply says whether the
--          queue has ever held grouped jobs, so callers skip the group lookup if not
-- ARGV[1] max ids to return, integer in [1, 4000] (bounded work per call)
-- ARGV[2] '1' when KEYS[1] holds packed delayed scores, '0' for plain ms scores
-- Returns: {now_ms, id1, id2, ...} oldest first; with KEYS[2]: {now_ms, grouped 0/1, id1, ...}
-- Errors:  EMQINPUT limit not an integer in [1, 4000]
--@include common

local limit = tonumber(ARGV[1])
if not limit or limit < 1 or limit > EMQ_MAX_BATCH or limit % 1 ~= 0 then
  return redis.error_reply('EMQINPUT limit must be an integer in [1, ' .. EMQ_MAX_BATCH .. ']')
end
local now = emq_now()
local bound = now
if ARGV[2] == '1' then bound = emq_due_bound(now) end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', bound, 'LIMIT', 0, limit)
if KEYS[2] then
  table.insert(ids, 1, redis.call('HGET', KEYS[2], 'grouped') == '1' and 1 or 0)
end
table.insert(ids, 1, now)
return ids
