-- extend.lua: push the lease deadline of jobs this worker still holds.
--
-- KEYS[1] active zset    emq:{q}:active
-- KEYS[2] leases hash    emq:{q}:leases
-- ARGV[1] new lease length ms from now (server clock)
-- ARGV[2..] pairs: job id, lease token
-- Returns: one 1/0 per pair: 1 extended, 0 lease no longer held
-- Errors:  EMQINPUT bad lease or odd pair list
--@include common

local lease = tonumber(ARGV[1])
if not lease or lease < 1 or (#ARGV - 1) % 2 ~= 0 then
  return redis.error_reply('EMQINPUT extend needs lease >= 1 and id/token pairs')
end
local deadline = emq_now() + lease
local out = {}
for i = 2, #ARGV, 2 do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 1] then
    redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
