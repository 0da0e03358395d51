-- dep_stale.lua: the jobs whose dependency links were not all sent within a grace period
-- (the enqueue that wrote them died between its steps), oldest first, on the server
-- clock. Read only: emqfast/facade/deps.py re-sends their links (idempotent).
--
-- KEYS[1] deplink_key  deplink zset    emq:{q}:deplink (job id -> enqueue ms while links are
--          unsent)
-- ARGV[1] grace_ms     grace ms: only marks older than this are listed
-- ARGV[2] limit_arg    the most ids to list, 1 .. 1000
-- Returns: job ids
-- Errors:  EMQINPUT a grace or limit that is not a number in range
--@include common

local deplink_key = KEYS[1]
local grace_ms = ARGV[1]
local limit_arg = ARGV[2]

local grace, limit = tonumber(grace_ms), tonumber(limit_arg)
if not grace or grace < 0 or not limit or limit < 1 or limit > 1000 or limit % 1 ~= 0 then
  return redis.error_reply('EMQINPUT dep_stale takes grace >= 0 and a limit in 1..1000')
end
return redis.call('ZRANGEBYSCORE', deplink_key, '-inf', emq_now() - grace, 'LIMIT', 0, limit)
