-- extend.lua: push the lease deadline of jobs this worker still holds. A deadline is
-- only ever moved later (ZADD GT): the worker's periodic renewal must not cut short a
-- longer lease the handler asked for with job.extend_lease().
--
-- KEYS[1] active zset    emq:{q}:active
-- KEYS[2] leases hash    emq:{q}:leases
-- KEYS[3] meta hash      emq:{q}:meta
-- ARGV[1] new lease length ms from now (server clock)
-- ARGV[2] keyspace version of the caller
-- ARGV[3..] pairs: job id, lease token
-- Returns: one 1/0 per pair: 1 held (deadline now at least now + lease), 0 lease no longer held
-- Errors:  EMQINPUT bad lease (not a whole number of ms >= 1), odd pair list or more than
--          EMQ_MAX_BATCH pairs (bounded work per call);
--          EMQVERSION keyspace of another major version
--@include common

local lease = tonumber(ARGV[1])
if not lease or lease < 1 or lease % 1 ~= 0 or #ARGV < 2 or (#ARGV - 2) % 2 ~= 0
    or (#ARGV - 2) / 2 > EMQ_MAX_BATCH then
  return redis.error_reply('EMQINPUT extend needs a whole lease >= 1 ms and at most ' ..
    EMQ_MAX_BATCH .. ' id/token pairs')
end
local err = emq_fence(KEYS[3], ARGV[2])
if err then return redis.error_reply(err) end
local deadline = emq_now() + lease
local out = {}
for i = 3, #ARGV, 2 do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 1] then
    redis.call('ZADD', KEYS[1], 'XX', 'GT', deadline, ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
