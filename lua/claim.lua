-- claim.lua: lease up to N pending jobs to one worker (lowest score first).
-- Phase one of taking work: it pops ids and records their leases without
-- touching job hashes (their keys are unknown until the pop); start.lua then
-- stamps each claimed job, with its key declared. A queue-wide rate limit (meta
-- 'rate_max' jobs per 'rate_window' ms, set by configure.lua) caps how many jobs
-- are claimed in any sliding window on the server clock.
--
-- KEYS[1] pending zset   emq:{q}:pending
-- KEYS[2] active zset    emq:{q}:active   (score = lease deadline, server ms)
-- KEYS[3] leases hash    emq:{q}:leases   (job id -> lease token)
-- KEYS[4] meta hash      emq:{q}:meta
-- KEYS[5] marker zset    emq:{q}:marker
-- KEYS[6] delayed zset   emq:{q}:delayed
-- KEYS[7] counter        emq:{q}:counter
-- KEYS[8] rate zset      emq:{q}:rate     (lease token -> claim instant, last window only)
-- ARGV[1] max jobs to claim (>= 1)
-- ARGV[2] lease length ms
-- ARGV[3] worker id (prefix of the lease tokens)
-- ARGV[4] keyspace version of the caller
-- Returns: {now_ms, status, next_due_ms, id1, token1, id2, token2, ...}
--          status 1 = claimed (maybe 0 jobs), 0 = queue paused, 2 = rate limited (jobs
--          wait but the window admits none now; nothing claimed);
--          next_due_ms = run-at of the earliest delayed job, -1 when none; with status 2
--          the window's opening instead when that comes first (the marker is set then too).
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

-- The rate window: members are the jobs claimed in the last rate_window ms.
local f = redis.call('HMGET', KEYS[4], 'rate_max', 'rate_window')
local rate_max, window = tonumber(f[1] or ''), tonumber(f[2] or '')
local limited = rate_max and window and rate_max > 0 and window > 0
local room = n
if limited then
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now - window)
  room = rate_max - redis.call('ZCARD', KEYS[8])
end
-- When the window's oldest claim leaves it, one more job may be claimed.
local function opens_at()
  local oldest = redis.call('ZRANGE', KEYS[8], 0, 0, 'WITHSCORES')
  return tonumber(oldest[2]) + window
end
if room <= 0 then
  if redis.call('ZCARD', KEYS[1]) > 0 then
    local open = opens_at()
    emq_wake_at(KEYS[5], open)  -- blocked workers wake when the window opens: no polling
    out[2] = 2
    if next_due == -1 or open < next_due then out[3] = open end
  end
  return out
end

local popped = redis.call('ZPOPMIN', KEYS[1], math.min(n, room))
local count = #popped / 2
if count == 0 then return out end

-- One counter draw for the whole batch: tokens are unique fencing numbers.
local last = redis.call('INCRBY', KEYS[7], count)
local deadline = now + lease
local zargs, hargs, rargs = {}, {}, {}
for i = 1, count do
  local id = popped[2 * i - 1]
  local token = ARGV[3] .. ':' .. emq_int(last - count + i)
  zargs[#zargs + 1] = deadline
  zargs[#zargs + 1] = id
  hargs[#hargs + 1] = id
  hargs[#hargs + 1] = token
  rargs[#rargs + 1] = now
  rargs[#rargs + 1] = token
  out[#out + 1] = id
  out[#out + 1] = token
end
redis.call('ZADD', KEYS[2], unpack(zargs))
redis.call('HSET', KEYS[3], unpack(hargs))
if limited then
  redis.call('ZADD', KEYS[8], unpack(rargs))
  redis.call('PEXPIRE', KEYS[8], window)  -- nothing outlives the window it counts for
end
-- More work left: pass the wake-up on to the next idle worker (or, the window
-- now full, have it woken when the window opens).
if redis.call('ZCARD', KEYS[1]) > 0 then
  if limited and room - count <= 0 then
    emq_wake_at(KEYS[5], opens_at())
  else
    emq_wake(KEYS[5])
  end
end
return out
