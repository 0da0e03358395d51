-- enqueue.lua: admit one job, either pending now or parked on the delayed set.
--
-- KEYS[1] job_key       job hash        emq:{q}:job:<id>
-- KEYS[2] pending_key   pending zset    emq:{q}:pending
-- KEYS[3] delayed_key   delayed zset    emq:{q}:delayed
-- KEYS[4] marker_key    marker zset     emq:{q}:marker
-- KEYS[5] meta_key      meta hash       emq:{q}:meta
-- KEYS[6] counter_key   counter         emq:{q}:counter
-- KEYS[7] events_key    events stream   emq:{q}:events
-- KEYS[8..] only with a dedupe key (ARGV[11..14]), three more:
--   KEYS[8] dedupe_hash_key  the dedupe hash emq:{q}:dedupe
--   KEYS[9] holder_key  the holder's hash emq:{q}:job:<ARGV[12]> (KEYS[1] again when
--          ARGV[12] is '')
--   KEYS[10] active_key  the active zset emq:{q}:active
-- ARGV[1] id            job id (must start with JOB)
-- ARGV[2] payload       payload bytes
-- ARGV[3] encoding      payload encoding: 'j' JSON text (the default: not stored), 'b' raw bytes
-- ARGV[4] opts          options (JSON object, opaque to Lua: attempts, backoff, ...); '' = the
--          library
--         defaults, stored as no 'opts' field
-- ARGV[5] priority_arg  priority, integer 0 .. 2^21-1
-- ARGV[6] mode          'now', 'at' (ARGV[7] = absolute run-at epoch ms) or 'in'
--          (ARGV[7] = delay ms on the server clock)
-- ARGV[7] run_at_arg    run-at or delay in ms ('0' for mode 'now')
-- ARGV[8] version       keyspace version of the caller
-- ARGV[9] acl           '0' skips the ACL check of the commands it writes with (a batch
--          checks them
--         in its first call on the connection); anything else, or absent, checks
-- ARGV[10..] optional extras (includes/dedupe.lua):
--   ARGV[10] expires_ms  expires ms ('' none: a job not started by its run-at + this is
--          discarded as expired by start.lua); then, with KEYS[8..10]:
--   ARGV[11] dedupe_id  the dedupe key (1..1024 bytes)
--   ARGV[12] expected_id  the job id the caller read in the dedupe hash for it ('' none)
--   ARGV[13] window_ms  the key's window ms ('' none: while its job waits or runs)
--   ARGV[14] dedupe_mode  the dedupe mode: 'drop', 'replace' or 'extend'
-- Returns: 1 admitted as pending (due now or already past), 2 admitted as scheduled
--          (parked on the delayed set), 0 duplicate id (idempotent no-op, nothing written),
--          3 deduplicated (the key's job ARGV[12] holds it; nothing written but, with
--          'extend', its window), 4 replaced (the key's waiting job ARGV[12] took the new
--          payload and run-at), 5 stale (the dedupe hash no longer names ARGV[12]: nothing
--          written; read it again and re-send)
-- Errors:  EMQKIND id without the JOB brand; EMQRANGE priority or run-at out of range; EMQINPUT an
--          id with ':', malformed mode/number/extras, or a replace whose waiting job is in another
--          group's lane; EMQVERSION keyspace of another major version; NOPERM the user's ACL denies
--          a command it writes with; EMQKEYTYPE a queue key it writes holds another type (or
--          WRONGTYPE from a key it reads). Each before any write.
--@include common
--@include admit
--@include dedupe

local job_key = KEYS[1]
local pending_key = KEYS[2]
local delayed_key = KEYS[3]
local marker_key = KEYS[4]
local meta_key = KEYS[5]
local counter_key = KEYS[6]
local events_key = KEYS[7]
local dedupe_hash_key = KEYS[8]
local holder_key = KEYS[9]
local active_key = KEYS[10]
local id = ARGV[1]
local payload = ARGV[2]
local encoding = ARGV[3]
local opts = ARGV[4]
local priority_arg = ARGV[5]
local mode = ARGV[6]
local run_at_arg = ARGV[7]
local version = ARGV[8]
local acl = ARGV[9]
local expires_ms = ARGV[10]
local dedupe_id = ARGV[11]
local expected_id = ARGV[12]
local window_ms = ARGV[13]
local dedupe_mode = ARGV[14]

-- Every read and check that can fail comes before the first write (bad input, a denied
-- command, ...): Redis does not roll back a script that errors half-way.
local bad, priority, run_at, now = emq_check_admission(id, priority_arg, mode, run_at_arg)
if bad then return redis.error_reply(bad) end
local xbad, x = emq_extras(#ARGV - 9, expires_ms, dedupe_id, expected_id, window_ms,
  dedupe_mode)  -- expiry and dedupe (nil: a plain job, nothing more to do)
if xbad then return redis.error_reply(xbad) end
local keyed = x ~= nil and x.key ~= nil
if keyed and #KEYS ~= 10 then
  return redis.error_reply('EMQINPUT a dedupe key needs the dedupe, holder and active keys')
end
if redis.call('EXISTS', job_key) == 1 then
  return 0
end
local verdict = 'admit'
if keyed then
  local verr
  verdict, verr = emq_dedupe_verdict(x, dedupe_hash_key, holder_key, active_key, pending_key,
                                     delayed_key, now)
  if verr then return redis.error_reply(verr) end
  if verdict == 'stale' then return 5 end
  if verdict == 'drop' or (verdict == 'extend' and not x.window) then return 3 end
end
local cap = emq_events_cap(meta_key)
local dscore = emq_admit_score(delayed_key, run_at, now)
local denied = emq_admit_denied(acl, dscore, job_key, pending_key, delayed_key, marker_key,
                                counter_key, events_key, cap ~= nil)
if not denied and keyed then
  denied = emq_dedupe_denied(acl, dedupe_hash_key, holder_key, pending_key, delayed_key)
end
if denied then return redis.error_reply(denied) end
local wrong = emq_admit_types(dscore, pending_key, marker_key, events_key, cap ~= nil)
if wrong then return redis.error_reply(wrong) end
local err = emq_fence(meta_key, version)  -- its version stamp is the first write
if err then return redis.error_reply(err) end

if verdict == 'extend' then
  redis.call('HSET', holder_key, 'ddu', emq_int(now + x.window))
  return 3
end
if verdict == 'replace' then
  local st = emq_dedupe_replace(x, holder_key, x.expected, pending_key, delayed_key, marker_key,
    payload, encoding, run_at, now, dscore)
  emq_event(events_key, cap, 'replaced', 'id', x.expected, 'state', st)
  return 4
end

-- the caller's mode does not say where the job went ('at' in the past is pending)
local state = emq_admit(job_key, pending_key, delayed_key, marker_key, counter_key, id, payload,
  encoding, opts, priority, run_at, now, dscore)
if x then emq_extras_keep(x, dedupe_hash_key, job_key, id, run_at, now) end
emq_event(events_key, cap, 'enqueued', 'id', id, 'state', state)
if state == 'scheduled' then
  return 2
end
return 1
