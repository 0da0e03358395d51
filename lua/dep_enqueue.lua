-- dep_enqueue.lua: write a job that waits for its dependencies (state waiting_deps): the
-- first step of an enqueue with depends_on. The job's hash, its entry on the
-- waitdeps set, the set of its remaining dependencies and its mark on deplink (links not
-- all sent yet) are written at once, in the job's own slot; the caller then links each
-- dependency in that dependency's slot (dep_link.lua) and clears the mark. A crash in
-- between leaves the mark, and the repair (emqfast/facade/deps.py) re-sends the links.
--
-- KEYS[1] job_key         job hash        emq:{q}:job:<id>
-- KEYS[2] waitdeps_key    waitdeps zset   emq:{q}:waitdeps (id -> enqueue ms, server clock)
-- KEYS[3] deps_key        deps set        emq:{q}:job:<id>:deps
-- KEYS[4] deplink_key     deplink zset    emq:{q}:deplink (id -> enqueue ms while its links are
--          unsent)
-- KEYS[5] meta_key        meta hash       emq:{q}:meta
-- KEYS[6] counter_key     counter         emq:{q}:counter
-- KEYS[7] events_key      events stream   emq:{q}:events
-- ARGV[1] id              job id (must start with JOB)
-- ARGV[2] payload         payload bytes
-- ARGV[3] encoding        payload encoding: 'j' JSON text (not stored), 'b' raw bytes
-- ARGV[4] opts            options (JSON, opaque here; '' = the library defaults, stored as no
--          field)
-- ARGV[5] priority_arg    priority, integer 0 .. 2^21-1 (its pending score is minted now)
-- ARGV[6] on_dep_failure  'fail' or 'run'
-- ARGV[7] version         keyspace version of the caller
-- ARGV[8..] its dependencies, "<queue>\0<job id>" each, 1 to 1000
-- Returns: 1 written (waiting_deps); 2 the id exists and its links are still unsent (a
--          re-run after a crash: the caller links it again); 0 the id exists otherwise
--          (a duplicate: nothing written)
-- Errors:  EMQKIND id without the JOB brand; EMQINPUT an id with ':', bad on_dep_failure or
--          dependency count; EMQRANGE priority out of range; EMQKEYTYPE its deps set key holds
--          another type; EMQVERSION keyspace of another major version; NOPERM the ACL denies a
--          command it writes with. Each before any write.
--@include common
--@include deps

local job_key = KEYS[1]
local waitdeps_key = KEYS[2]
local deps_key = KEYS[3]
local deplink_key = KEYS[4]
local meta_key = KEYS[5]
local counter_key = KEYS[6]
local events_key = KEYS[7]
local id = ARGV[1]
local payload = ARGV[2]
local encoding = ARGV[3]
local opts = ARGV[4]
local priority_arg = ARGV[5]
local on_dep_failure = ARGV[6]
local version = ARGV[7]

local bad_id = emq_new_id_error(id)
if bad_id then return redis.error_reply(bad_id) end
local priority = tonumber(priority_arg)
if not priority or priority < 0 or priority > 2097151 or priority % 1 ~= 0 then
  return redis.error_reply('EMQRANGE priority must be an integer in [0, 2097151]')
end
if on_dep_failure ~= 'fail' and on_dep_failure ~= 'run' then
  return redis.error_reply('EMQINPUT on_dep_failure must be fail or run')
end
if #ARGV < 8 or #ARGV - 7 > EMQ_MAX_DEPS then
  return redis.error_reply('EMQINPUT a job takes 1 to ' .. EMQ_MAX_DEPS .. ' dependencies')
end
if redis.call('EXISTS', job_key) == 1 then
  if redis.call('ZSCORE', deplink_key, id) then return 2 end
  return 0
end
-- Its deps set is its own: a key of another type there is refused before any write.
local held = redis.pcall('SCARD', deps_key)
if type(held) == 'table' and held.err then
  return redis.error_reply('EMQKEYTYPE ' .. deps_key .. ' holds a key of another type: ' ..
    'the job was not written')
end
local cap = emq_events_cap(meta_key)
local denied = emq_deps_denied({{'INCR', counter_key}, {'HSET', job_key, 'f', 'v'},
  {'ZADD', waitdeps_key, '0', 'm'}, {'ZADD', deplink_key, '0', 'm'}, {'SADD', deps_key, 'm'}})
if not denied and cap then denied = emq_deps_denied({{'XADD', events_key, '*', 'f', 'v'}}) end
if denied then return redis.error_reply(denied) end
local now = emq_now()
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end

local seq = redis.call('INCR', counter_key)
local ps = priority * 4294967296 + (seq % 4294967296)
local fields = {'payload', payload, 'ps', emq_int(ps), 'created', emq_int(now),
  'state', 'waiting_deps', 'odf', on_dep_failure}
if encoding ~= 'j' then
  fields[#fields + 1] = 'enc'
  fields[#fields + 1] = encoding
end
if opts ~= '' then
  fields[#fields + 1] = 'opts'
  fields[#fields + 1] = opts
end
redis.call('HSET', job_key, unpack(fields))
redis.call('ZADD', waitdeps_key, now, id)
redis.call('ZADD', deplink_key, now, id)
for s = 8, #ARGV, 500 do  -- chunked: Lua's unpack() has a stack limit
  redis.call('SADD', deps_key, unpack(ARGV, s, math.min(s + 499, #ARGV)))
end
emq_event(events_key, cap, 'enqueued', 'id', id, 'state', 'waiting_deps')
return 1
