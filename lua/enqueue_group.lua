-- enqueue_group.lua: admit one job of a group: due now, it waits in its group's lane
-- (and the group joins the ring of ready groups); later, it is parked on the delayed
-- set like any job (promote sends it to its lane when due).
--
-- KEYS[1] job_key       job hash        emq:{q}:job:<id>
-- KEYS[2] lane_key      lane zset       emq:{q}:g:<group>:pending
-- KEYS[3] delayed_key   delayed zset    emq:{q}:delayed
-- KEYS[4] marker_key    marker zset     emq:{q}:marker
-- KEYS[5] meta_key      meta hash       emq:{q}:meta
-- KEYS[6] counter_key   counter         emq:{q}:counter
-- KEYS[7] events_key    events stream   emq:{q}:events
-- KEYS[8] groups_key    groups zset     emq:{q}:groups   (ring of ready groups)
-- KEYS[9..] only with a dedupe key (ARGV[12..15]), three more:
--   KEYS[9] dedupe_hash_key  the dedupe hash emq:{q}:dedupe
--   KEYS[10] holder_key  the holder's hash emq:{q}:job:<ARGV[13]> (KEYS[1] again when
--          ARGV[13] is '')
--   KEYS[11] active_key  the active zset emq:{q}:active
-- ARGV[1] id            job id (must start with JOB)
-- ARGV[2] payload       payload bytes
-- ARGV[3] encoding      payload encoding: 'j' JSON text (the default: not stored), 'b' raw bytes
-- ARGV[4] opts          options (JSON object, opaque to Lua); '' = the library defaults, stored as
--          no
--         'opts' field
-- ARGV[5] priority_arg  priority, integer 0 .. 2^21-1
-- ARGV[6] mode          'now', 'at' (ARGV[7] = absolute run-at epoch ms) or 'in'
--          (ARGV[7] = delay ms on the server clock)
-- ARGV[7] run_at_arg    run-at or delay in ms ('0' for mode 'now')
-- ARGV[8] version       keyspace version of the caller
-- ARGV[9] group         group name (validated by the caller: no braces, no NUL)
-- ARGV[10] acl          '0' skips the ACL check of the commands it writes with (a batch checks
--          them in its first call on the connection); anything else, or absent, checks
-- ARGV[11..] optional extras, as enqueue.lua's ARGV[10..]:
--   ARGV[11] expires_ms  expires ms ('' none); then, with KEYS[9..11]:
--   ARGV[12] dedupe_id  the dedupe key
--   ARGV[13] expected_id  the job id the caller read in the dedupe hash ('' none)
--   ARGV[14] window_ms  window ms ('' none)
--   ARGV[15] dedupe_mode  the mode 'drop', 'replace' or 'extend'
-- Returns: 1 admitted to its lane, 2 admitted as scheduled, 0 duplicate id (nothing written),
--          3 deduplicated, 4 replaced, 5 stale (as enqueue.lua's)
-- Errors:  EMQKIND id without the JOB brand; EMQRANGE priority or run-at out of range; EMQINPUT an
--          id with ':', malformed mode/number/extras, empty group, or a replace whose waiting job
--          is in another group's lane; EMQVERSION keyspace of another major version; NOPERM the
--          user's ACL denies a command it writes with; EMQKEYTYPE a queue key it writes holds
--          another type (or WRONGTYPE from a key it reads). Each before any write.
--@include common
--@include admit
--@include groups
--@include dedupe

local job_key = KEYS[1]
local lane_key = KEYS[2]
local delayed_key = KEYS[3]
local marker_key = KEYS[4]
local meta_key = KEYS[5]
local counter_key = KEYS[6]
local events_key = KEYS[7]
local groups_key = KEYS[8]
local dedupe_hash_key = KEYS[9]
local holder_key = KEYS[10]
local active_key = KEYS[11]
local id = ARGV[1]
local payload = ARGV[2]
local encoding = ARGV[3]
local opts = ARGV[4]
local priority_arg = ARGV[5]
local mode = ARGV[6]
local run_at_arg = ARGV[7]
local version = ARGV[8]
local group = ARGV[9]
local acl = ARGV[10]
local expires_ms = ARGV[11]
local dedupe_id = ARGV[12]
local expected_id = ARGV[13]
local window_ms = ARGV[14]
local dedupe_mode = ARGV[15]

-- Validate everything before the first write: bad input leaves Redis untouched.
local bad, priority, run_at, now = emq_check_admission(id, priority_arg, mode, run_at_arg)
if bad then return redis.error_reply(bad) end
if not group or group == '' then
  return redis.error_reply('EMQINPUT a grouped job needs a group name')
end
local xbad, x = emq_extras(#ARGV - 10, expires_ms, dedupe_id, expected_id, window_ms,
  dedupe_mode)  -- expiry and dedupe (nil: none)
if xbad then return redis.error_reply(xbad) end
local keyed = x ~= nil and x.key ~= nil
if keyed and #KEYS ~= 11 then
  return redis.error_reply('EMQINPUT a dedupe key needs the dedupe, holder and active keys')
end
if redis.call('EXISTS', job_key) == 1 then
  return 0
end
local verdict = 'admit'
if keyed then
  x.group = group
  local verr
  verdict, verr = emq_dedupe_verdict(x, dedupe_hash_key, holder_key, active_key, lane_key,
                                     delayed_key, now)
  if verr then return redis.error_reply(verr) end
  if verdict == 'stale' then return 5 end
  if verdict == 'drop' or (verdict == 'extend' and not x.window) then return 3 end
end
local cap = emq_events_cap(meta_key)
local dscore = emq_admit_score(delayed_key, run_at, now)
local denied = emq_admit_denied(acl, dscore, job_key, lane_key, delayed_key, marker_key,
                                counter_key, events_key, cap ~= nil)
if not denied and not dscore and acl ~= '0' and redis.acl_check_cmd
    and not (redis.acl_check_cmd('ZADD', groups_key, '0', 'm')
             and redis.acl_check_cmd('ZRANGE', groups_key, '-1', '-1')) then
  denied = 'NOPERM this user may not ZADD/ZRANGE the ring of ready groups: nothing was written'
end
if not denied and keyed then
  denied = emq_dedupe_denied(acl, dedupe_hash_key, holder_key, lane_key, delayed_key)
end
if denied then return redis.error_reply(denied) end
local wrong = emq_admit_types(dscore, lane_key, marker_key, events_key, cap ~= nil)
  or (not dscore and emq_key_type_error(groups_key, 'zset'))
if wrong then return redis.error_reply(wrong) end
local err = emq_fence(meta_key, version)  -- its version stamp is the first write
if err then return redis.error_reply(err) end

if verdict == 'extend' then
  redis.call('HSET', holder_key, 'ddu', emq_int(now + x.window))
  return 3
end
if verdict == 'replace' then
  local st = emq_dedupe_replace(x, holder_key, x.expected, lane_key, delayed_key, marker_key,
    payload, encoding, run_at, now, dscore)
  emq_event(events_key, cap, 'replaced', 'id', x.expected, 'state', st, 'group', group)
  if st == 'pending' then emq_ring_back(groups_key, group, false) end
  return 4
end

-- the shared admission, with the lane standing in for the flat pending set
local state = emq_admit(job_key, lane_key, delayed_key, marker_key, counter_key, id, payload,
  encoding, opts, priority, run_at, now, dscore)
redis.call('HSET', job_key, 'group', group)
if x then emq_extras_keep(x, dedupe_hash_key, job_key, id, run_at, now) end
-- the queue now has grouped jobs: promote/reap must look up groups (due.lua reports it)
redis.call('HSET', meta_key, 'grouped', '1')
emq_event(events_key, cap, 'enqueued', 'id', id, 'state', state, 'group', group)
if state == 'scheduled' then
  return 2
end
emq_ring_back(groups_key, group, false)
return 1
