-- enqueue.lua: admit one job, either pending now or parked on the delayed set.
--
-- KEYS[1] job hash       emq:{q}:job:<id>
-- KEYS[2] pending zset   emq:{q}:pending
-- KEYS[3] delayed zset   emq:{q}:delayed
-- KEYS[4] marker zset    emq:{q}:marker
-- KEYS[5] meta hash      emq:{q}:meta
-- KEYS[6] counter        emq:{q}:counter
-- KEYS[7] events stream  emq:{q}:events
-- ARGV[1] job id (must start with JOB)
-- ARGV[2] payload bytes
-- ARGV[3] payload encoding: 'j' JSON text (the default: not stored), 'b' raw bytes
-- ARGV[4] options (JSON object, opaque to Lua: attempts, backoff, ...); '' = the library
--         defaults, stored as no 'opts' field
-- ARGV[5] priority, integer 0 .. 2^21-1
-- ARGV[6] mode: 'now', 'at' (ARGV[7] = absolute run-at epoch ms) or 'in'
--          (ARGV[7] = delay ms on the server clock)
-- ARGV[7] run-at or delay in ms ('0' for mode 'now')
-- ARGV[8] keyspace version of the caller
-- ARGV[9] acl: '0' skips the ACL check of the commands it writes with (a batch checks them
--         in its first call on the connection); anything else, or absent, checks
-- Returns: 1 admitted as pending (due now or already past), 2 admitted as scheduled
--          (parked on the delayed set), 0 duplicate id (idempotent no-op, nothing written)
-- Errors:  EMQKIND id without the JOB brand; EMQRANGE priority or run-at out of range;
--          EMQINPUT malformed mode/number; EMQVERSION keyspace of another major version;
--          NOPERM the user's ACL denies a command it writes with. Each before any write.
--@include common
--@include admit

local id = ARGV[1]
-- Every read and check that can fail comes before the first write (bad input, a denied
-- command, ...): Redis does not roll back a script that errors half-way.
local bad, priority, run_at, now = emq_check_admission(id, ARGV[5], ARGV[6], ARGV[7])
if bad then return redis.error_reply(bad) end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local cap = emq_events_cap(KEYS[5])
local dscore = emq_admit_score(KEYS[3], run_at, now)
local denied = emq_admit_denied(ARGV[9], dscore, KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6],
                                KEYS[7], cap ~= nil)
if denied then return redis.error_reply(denied) end
local err = emq_fence(KEYS[5], ARGV[8])  -- its version stamp is the first write
if err then return redis.error_reply(err) end

-- the caller's mode does not say where the job went ('at' in the past is pending)
local state = emq_admit(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], id, ARGV[2], ARGV[3],
  ARGV[4], priority, run_at, now, dscore)
emq_event(KEYS[7], cap, 'enqueued', 'id', id, 'state', state)
if state == 'scheduled' then
  return 2
end
return 1
