-- claim.lua: lease up to N pending jobs to one worker (lowest score first).
-- Phase one of taking work: it pops ids and records their leases without
-- touching job hashes (their keys are unknown until the pop); start.lua then
-- stamps each claimed job, with its key declared.
--
-- KEYS[1] pending zset   emq:{q}:pending
-- KEYS[2] active zset    emq:{q}:active   (score = lease deadline, server ms)
-- KEYS[3] leases hash    emq:{q}:leases   (job id -> lease token)
-- KEYS[4] meta hash      emq:{q}:meta
-- KEYS[5] marker zset    emq:{q}:marker
-- KEYS[6] delayed zset   emq:{q}:delayed
-- KEYS[7] counter        emq:{q}:counter
-- ARGV[1] max jobs to claim (>= 1)
-- ARGV[2] lease length ms
-- ARGV[3] worker id (prefix of the lease tokens)
-- ARGV[4] keyspace version of the caller
-- Returns: {now_ms, status, next_due_ms, id1, token1, id2, token2, ...}
--          status 1 = claimed (maybe 0 jobs), 0 = queue paused;
--          next_due_ms = run-at of the earliest delayed job, -1 when none.
-- Errors:  EMQINPUT bad count or lease; EMQVERSION keyspace of another major version
--@include common

local n = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
if not n or n < 1 or not lease or lease < 1 then
  return redis.error_reply('EMQINPUT claim needs count >= 1 and lease >= 1 ms')
end
local err = emq_fence(KEYS[4], ARGV[4])
if err then return redis.error_reply(err) end

local now = emq_now()
local head = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
local next_due = -1
if head[2] then next_due = emq_unpack_delayed(head[2]) end

local out = {now, 1, next_due}
if redis.call('HGET', KEYS[4], 'paused') == '1' then
  out[2] = 0
  return out
end
local popped = redis.call('ZPOPMIN', KEYS[1], n)
local count = #popped / 2
if count == 0 then return out end

-- One counter draw for the whole batch: tokens are unique fencing numbers.
local last = redis.call('INCRBY', KEYS[7], count)
local deadline = now + lease
local zargs, hargs = {}, {}
for i = 1, count do
  local id = popped[2 * i - 1]
  local token = ARGV[3] .. ':' .. emq_int(last - count + i)
  zargs[#zargs + 1] = deadline
  zargs[#zargs + 1] = id
  hargs[#hargs + 1] = id
  hargs[#hargs + 1] = token
  out[#out + 1] = id
  out[#out + 1] = token
end
redis.call('ZADD', KEYS[2], unpack(zargs))
redis.call('HSET', KEYS[3], unpack(hargs))
-- More work left: pass the wake-up on to the next idle worker.
if redis.call('ZCARD', KEYS[1]) > 0 then emq_wake(KEYS[5]) end
return out
