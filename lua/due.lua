-- due.lua: read-only: the ids whose time has come on the server clock, so the
-- caller can declare their job keys to promote.lua / reap.lua.
--
-- KEYS[1] zset_key   zset: emq:{q}:delayed (packed run-at scores) or emq:{q}:active (lease
--          deadlines)
-- KEYS[2..] optional:
--   KEYS[2] meta_key  meta hash emq:{q}:meta; then the reply says whether the queue has
--          ever held grouped jobs, so callers skip the group lookup if not
-- ARGV[1] limit_arg  max ids to return, integer in [1, 4000] (bounded work per call)
-- ARGV[2] packed     '1' when KEYS[1] holds packed delayed scores, '0' for plain ms scores
-- Returns: {now_ms, id1, id2, ...} oldest first; with KEYS[2]: {now_ms, grouped 0/1, id1, ...}
-- Errors:  EMQINPUT limit not an integer in [1, 4000]
--@include common

local zset_key = KEYS[1]
local meta_key = KEYS[2]
local limit_arg = ARGV[1]
local packed = ARGV[2]

local limit = tonumber(limit_arg)
if not limit or limit < 1 or limit > EMQ_MAX_BATCH or limit % 1 ~= 0 then
  return redis.error_reply('EMQINPUT limit must be an integer in [1, ' .. EMQ_MAX_BATCH .. ']')
end
local now = emq_now()
local bound = now
if packed == '1' then bound = emq_due_bound(now) end
local ids = redis.call('ZRANGEBYSCORE', zset_key, '-inf', bound, 'LIMIT', 0, limit)
if meta_key then
  table.insert(ids, 1, redis.call('HGET', meta_key, 'grouped') == '1' and 1 or 0)
end
table.insert(ids, 1, now)
return ids
