-- start.lua: phase two of taking work: stamp each claimed job as running and
-- return what the handler needs. A job whose lease is no longer ours (reaped
-- and re-claimed in between) is skipped.
--
-- KEYS[1] active zset    emq:{q}:active
-- KEYS[2] leases hash    emq:{q}:leases
-- KEYS[3] meta hash      emq:{q}:meta
-- KEYS[4] events stream  emq:{q}:events
-- KEYS[5..] job hashes   emq:{q}:job:<id>, one per claimed job, in ARGV pair order
-- ARGV[1] keyspace version of the caller
-- ARGV[2..] pairs: job id, lease token (same order as KEYS[5..])
-- Returns: one entry per job: {attempts, payload, enc, opts, created, run_at, started} when
--          the lease holds (enc, opts, run_at nil when the hash omits them; started = now,
--          server ms, which the Worker hands back to complete.lua), or 0 when it was lost
--          (or the job hash is gone)
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts; EMQVERSION keyspace of another major version
--@include common

if #ARGV < 1 or #ARGV - 1 ~= 2 * (#KEYS - 4) then
  return redis.error_reply('EMQINPUT start needs one id/token pair per job key')
end
local err = emq_fence(KEYS[3], ARGV[1])
if err then return redis.error_reply(err) end
local now = emq_int(emq_now())
local cap = emq_events_cap(KEYS[3])
-- Every lease in one read (one bridge call per job fewer than a per-job HGET).
local ids = {}
for i = 5, #KEYS do ids[#ids + 1] = ARGV[2 * (i - 4)] end
local held = {}
for s = 1, #ids, 4000 do  -- (chunks: Lua's unpack() has a stack limit)
  for _, v in ipairs(redis.call('HMGET', KEYS[2], unpack(ids, s, math.min(s + 3999, #ids)))) do
    held[#held + 1] = v
  end
end
local out = {}
for i = 5, #KEYS do
  local id, token = ARGV[2 * (i - 4)], ARGV[2 * (i - 4) + 1]
  local key = KEYS[i]
  local f = false
  if held[i - 4] == token then
    -- one read of what the handler needs; no payload field means the hash is gone
    f = redis.call('HMGET', key, 'payload', 'enc', 'opts', 'created', 'attempts', 'run_at')
    if not f[1] then f = false end
  end
  if f then
    local attempts = (tonumber(f[5] or '0') or 0) + 1
    redis.call('HSET', key, 'attempts', attempts, 'state', 'active', 'started', now,
      'worker', token)
    emq_event_untrimmed(KEYS[4], cap, 'active', 'id', id, 'attempt', attempts)
    out[#out + 1] = {attempts, f[1], f[2], f[3], f[4], f[6], now}
  else
    if held[i - 4] == token then
      -- a lease on a job whose hash vanished: drop the lease, nothing to run
      redis.call('HDEL', KEYS[2], id)
      redis.call('ZREM', KEYS[1], id)
    end
    out[#out + 1] = 0
  end
end
emq_trim_events(KEYS[4], cap)
return out
