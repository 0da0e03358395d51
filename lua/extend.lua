-- extend.lua: push the lease deadline of jobs this worker still holds. A deadline is
-- only ever moved later (ZADD GT): the worker's periodic renewal must not cut short a
-- longer lease the handler asked for with job.extend_lease().
--
-- KEYS[1] active_key  active zset     emq:{q}:active
-- KEYS[2] leases_key  leases hash     emq:{q}:leases
-- KEYS[3] meta_key    meta hash       emq:{q}:meta
-- ARGV[1] lease_ms    new lease length ms from now (server clock)
-- ARGV[2] version     keyspace version of the caller
-- ARGV[3..] pairs: job id, lease token
-- Returns: one 1/0 per pair: 1 held (deadline now at least now + lease), 0 lease no longer held
-- Errors:  EMQINPUT bad lease (not a whole number of ms >= 1), odd pair list or more than
--          EMQ_MAX_BATCH pairs (bounded work per call);
--          EMQVERSION keyspace of another major version
--@include common

local active_key = KEYS[1]
local leases_key = KEYS[2]
local meta_key = KEYS[3]
local lease_ms = ARGV[1]
local version = ARGV[2]

local lease = tonumber(lease_ms)
if not lease or lease < 1 or lease % 1 ~= 0 or #ARGV < 2 or (#ARGV - 2) % 2 ~= 0
    or (#ARGV - 2) / 2 > EMQ_MAX_BATCH then
  return redis.error_reply('EMQINPUT extend needs a whole lease >= 1 ms and at most ' ..
    EMQ_MAX_BATCH .. ' id/token pairs')
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local deadline = emq_now() + lease
local out = {}
for i = 3, #ARGV, 2 do
  if redis.call('HGET', leases_key, ARGV[i]) == ARGV[i + 1] then
    redis.call('ZADD', active_key, 'XX', 'GT', deadline, ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
