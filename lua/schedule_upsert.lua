-- schedule_upsert.lua: register or update one repeatable schedule, by name, in
-- two phases so the caller never needs its own clock. 'keep' rewrites the options
-- when the stored cadence has the same signature (the boot case: one round trip,
-- timing untouched); otherwise it writes nothing and replies with the server's
-- now, the last minted occurrence and the generation, from which the caller
-- computes the next run and calls again with 'set'. 'set' rewrites the record and
-- the single registry entry and bumps the generation, so a pump holding a view of
-- the old cadence can no longer mint under it.
--
-- KEYS[1] repeat_key   repeat zset     emq:{q}:repeat          (name -> next run, epoch ms)
-- KEYS[2] record_key   record hash     emq:{q}:repeat:<name>
-- KEYS[3] meta_key     meta hash       emq:{q}:meta
-- KEYS[4] marker_key   marker zset     emq:{q}:marker
-- KEYS[5] counter_key  counter         emq:{q}:counter         (generations are drawn from it)
-- ARGV[1] name         schedule name
-- ARGV[2] sig          cadence signature (opaque; equal signature = same timing)
-- ARGV[3] mode         'keep' or 'set'
-- ARGV[4] base_gen     'set': the generation the caller's plan was based on ('' = no record)
-- ARGV[5] next_run_ms  'set': next run, epoch ms (must be after the last minted occurrence)
-- ARGV[6] anchor_ms    'set': interval anchor, epoch ms ('' for cron cadences)
-- ARGV[7] version      keyspace version of the caller
-- ARGV[8..] option field, value pairs (kind, cron, tz, every, start, missed, limit,
--           payload, enc, opts, prio, name; at most 64 pairs); written in both modes
-- Returns: {status, next_run_ms (-1 none), generation ('' none), last_ms (-1 none), now_ms,
--           anchor ('' none), last_job ('' none)}
--          status 2 = cadence set (new or changed); 1 = options updated, timing kept;
--          0 = nothing written: call again with 'set' (or again, if the plan went stale)
-- Errors:  EMQINPUT malformed mode, numbers or option pairs; EMQRANGE next run out of range;
--          EMQVERSION keyspace of another major version
--@include common
--@include schedule

local repeat_key = KEYS[1]
local record_key = KEYS[2]
local meta_key = KEYS[3]
local marker_key = KEYS[4]
local counter_key = KEYS[5]
local name = ARGV[1]
local sig = ARGV[2]
local mode = ARGV[3]
local base_gen = ARGV[4]
local next_run_ms = ARGV[5]
local anchor_ms = ARGV[6]
local version = ARGV[7]

-- The options are written with unpack(): bound their count (never unpack a caller-sized
-- table past Lua's stack limit, which would fail after the generation's INCR).
local EMQ_MAX_OPTION_PAIRS = 64
if name == '' or sig == '' or (mode ~= 'keep' and mode ~= 'set') then
  return redis.error_reply('EMQINPUT upsert needs a name, a signature and mode keep/set')
end
if (#ARGV - 7) % 2 ~= 0 or #ARGV < 9 or #ARGV - 7 > 2 * EMQ_MAX_OPTION_PAIRS then
  return redis.error_reply('EMQINPUT upsert options must be at most ' .. EMQ_MAX_OPTION_PAIRS ..
    ' field/value pairs')
end
-- Fields this script owns: the caller may not smuggle them in with the options.
local reserved = {sig = true, gen = true, anchor = true, last = true, last_job = true}
for i = 8, #ARGV, 2 do
  if reserved[ARGV[i]] then
    return redis.error_reply('EMQINPUT option field ' .. ARGV[i] .. ' is reserved')
  end
end
local nxt, anchor = nil, nil
if mode == 'set' then
  nxt = tonumber(next_run_ms)
  anchor = anchor_ms
  if not nxt or nxt % 1 ~= 0 or (anchor ~= '' and not tonumber(anchor)) then
    return redis.error_reply('EMQINPUT upsert set needs an integer next run and anchor')
  end
  if nxt < 0 or nxt - EMQ_EPOCH > EMQ_MAX_OFFSET then
    return redis.error_reply('EMQRANGE next run beyond the exact range of scores')
  end
end

local now = emq_now()
local cur = redis.call('HMGET', record_key, 'sig', 'gen', 'last', 'anchor', 'last_job')
local gen = cur[2] or ''
local last = tonumber(cur[3] or '-1')
local function reply(status, next_run, generation, anch)
  return {status, next_run, generation, emq_int(last), now, anch or cur[4] or '', cur[5] or ''}
end
local function current_next()
  local s = redis.call('ZSCORE', repeat_key, name)
  if not s or s == 'inf' then return -1 end
  return emq_int(tonumber(s))
end

if mode == 'keep' then
  if cur[1] ~= sig then return reply(0, -1, gen) end
  local err = emq_fence(meta_key, version)
  if err then return redis.error_reply(err) end
  redis.call('HSET', record_key, unpack(ARGV, 8))
  return reply(1, current_next(), gen)
end

-- 'set': the caller planned against generation base_gen; a concurrent upsert or
-- a mint past the planned next run makes the plan stale (reply 0, no write).
if gen ~= base_gen or (last >= 0 and nxt <= last) then return reply(0, -1, gen) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local newgen = emq_int(redis.call('INCR', counter_key))
redis.call('HSET', record_key, unpack(ARGV, 8))
redis.call('HSET', record_key, 'sig', sig, 'gen', newgen, 'anchor', anchor)
redis.call('ZADD', repeat_key, nxt, name)
emq_wake_for_run(marker_key, nxt, now)
return reply(2, emq_int(nxt), newgen, anchor)
