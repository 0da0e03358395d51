-- enqueue_group.lua: admit one job of a group: due now, it waits in its group's lane
-- (and the group joins the ring of ready groups); later, it is parked on the delayed
-- set like any job (promote sends it to its lane when due).
--
-- KEYS[1] job hash       emq:{q}:job:<id>
-- KEYS[2] lane zset      emq:{q}:g:<group>:pending
-- KEYS[3] delayed zset   emq:{q}:delayed
-- KEYS[4] marker zset    emq:{q}:marker
-- KEYS[5] meta hash      emq:{q}:meta
-- KEYS[6] counter        emq:{q}:counter
-- KEYS[7] events stream  emq:{q}:events
-- KEYS[8] groups zset    emq:{q}:groups   (ring of ready groups)
-- KEYS[9..] only with a dedupe key (ARGV[12..15]), three more: KEYS[9] the dedupe hash
--         emq:{q}:dedupe, KEYS[10] the holder's hash emq:{q}:job:<ARGV[13]> (KEYS[1] again
--         when ARGV[13] is ''), KEYS[11] the active zset emq:{q}:active
-- ARGV[1] job id (must start with JOB)
-- ARGV[2] payload bytes
-- ARGV[3] payload encoding: 'j' JSON text (the default: not stored), 'b' raw bytes
-- ARGV[4] options (JSON object, opaque to Lua); '' = the library defaults, stored as no
--         'opts' field
-- ARGV[5] priority, integer 0 .. 2^21-1
-- ARGV[6] mode: 'now', 'at' (ARGV[7] = absolute run-at epoch ms) or 'in'
--          (ARGV[7] = delay ms on the server clock)
-- ARGV[7] run-at or delay in ms ('0' for mode 'now')
-- ARGV[8] keyspace version of the caller
-- ARGV[9] group name (validated by the caller: no braces, no NUL)
-- ARGV[10] acl: '0' skips the ACL check of the commands it writes with (a batch checks
--          them in its first call on the connection); anything else, or absent, checks
-- ARGV[11..] optional extras, as enqueue.lua's ARGV[10..]: ARGV[11] expires ms ('' none);
--          with KEYS[9..11]: ARGV[12] the dedupe key, ARGV[13] the job id the caller read
--          in the dedupe hash ('' none), ARGV[14] window ms ('' none), ARGV[15] the mode
--          'drop', 'replace' or 'extend'
-- Returns: 1 admitted to its lane, 2 admitted as scheduled, 0 duplicate id (nothing written),
--          3 deduplicated, 4 replaced, 5 stale (as enqueue.lua's)
-- Errors:  EMQKIND id without the JOB brand; EMQRANGE priority or run-at out of range;
--          EMQINPUT malformed mode/number/extras, empty group, or a replace whose waiting
--          job is in another group's lane;
--          EMQVERSION keyspace of another major version;
--          NOPERM the user's ACL denies a command it writes with. Each before any write.
--@include common
--@include admit
--@include groups
--@include dedupe

local id = ARGV[1]
-- Validate everything before the first write: bad input leaves Redis untouched.
local bad, priority, run_at, now = emq_check_admission(id, ARGV[5], ARGV[6], ARGV[7])
if bad then return redis.error_reply(bad) end
local group = ARGV[9]
if not group or group == '' then
  return redis.error_reply('EMQINPUT a grouped job needs a group name')
end
local xbad, x = emq_extras(11)  -- expiry and dedupe (nil: none)
if xbad then return redis.error_reply(xbad) end
local keyed = x ~= nil and x.key ~= nil
if keyed and #KEYS ~= 11 then
  return redis.error_reply('EMQINPUT a dedupe key needs the dedupe, holder and active keys')
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local verdict = 'admit'
if keyed then
  x.group = group
  local verr
  verdict, verr = emq_dedupe_verdict(x, KEYS[9], KEYS[10], KEYS[11], KEYS[2], KEYS[3], now)
  if verr then return redis.error_reply(verr) end
  if verdict == 'stale' then return 5 end
  if verdict == 'drop' or (verdict == 'extend' and not x.window) then return 3 end
end
local cap = emq_events_cap(KEYS[5])
local dscore = emq_admit_score(KEYS[3], run_at, now)
local denied = emq_admit_denied(ARGV[10], dscore, KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6],
                                KEYS[7], cap ~= nil)
if not denied and not dscore and ARGV[10] ~= '0' and redis.acl_check_cmd
    and not (redis.acl_check_cmd('ZADD', KEYS[8], '0', 'm')
             and redis.acl_check_cmd('ZRANGE', KEYS[8], '-1', '-1')) then
  denied = 'NOPERM this user may not ZADD/ZRANGE the ring of ready groups: nothing was written'
end
if not denied and keyed then denied = emq_dedupe_denied(ARGV[10], KEYS[9], KEYS[10], KEYS[2],
                                                        KEYS[3]) end
if denied then return redis.error_reply(denied) end
local err = emq_fence(KEYS[5], ARGV[8])  -- its version stamp is the first write
if err then return redis.error_reply(err) end

if verdict == 'extend' then
  redis.call('HSET', KEYS[10], 'ddu', emq_int(now + x.window))
  return 3
end
if verdict == 'replace' then
  local st = emq_dedupe_replace(x, KEYS[10], x.expected, KEYS[2], KEYS[3], KEYS[4], ARGV[2],
    ARGV[3], run_at, now, dscore)
  emq_event(KEYS[7], cap, 'replaced', 'id', x.expected, 'state', st, 'group', group)
  if st == 'pending' then emq_ring_back(KEYS[8], group, false) end
  return 4
end

-- the shared admission, with the lane standing in for the flat pending set
local state = emq_admit(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], id, ARGV[2], ARGV[3],
  ARGV[4], priority, run_at, now, dscore)
redis.call('HSET', KEYS[1], 'group', group)
if x then emq_extras_keep(x, KEYS[9], KEYS[1], id, run_at, now) end
-- the queue now has grouped jobs: promote/reap must look up groups (due.lua reports it)
redis.call('HSET', KEYS[5], 'grouped', '1')
emq_event(KEYS[7], cap, 'enqueued', 'id', id, 'state', state, 'group', group)
if state == 'scheduled' then
  return 2
end
emq_ring_back(KEYS[8], group, false)
return 1
