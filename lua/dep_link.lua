-- dep_link.lua: link a waiting job to one of its dependencies, in the dependency's slot:
-- the dependent joins the dependency's dependents set and the dependency is
-- counted on the queue's dependents hash, which the finish hook (includes/finished.lua)
-- reads when the dependency ends for good: it then queues "<outcome>\0<id>" on the outbox.
-- Idempotent: a link sent again (a re-run, the crash repair) adds nothing. A dependency
-- that has already ended is not linked: its state is returned and the caller resolves the
-- dependent at once (dep_resolve.lua). Atomic with the finish hook (one slot), so a
-- dependency ends either before the link (seen here) or after it (queued on the outbox).
--
-- KEYS[1] dependency's job hash       emq:{d}:job:<dep id>
-- KEYS[2] its dependents set          emq:{d}:job:<dep id>:dependents
-- KEYS[3] dependents hash             emq:{d}:dependents
-- KEYS[4] meta hash                   emq:{d}:meta
-- ARGV[1] the dependency's job id
-- ARGV[2] the dependent, "<queue>\0<job id>"
-- ARGV[3] keyspace version of the caller
-- Returns: 'linked' (now or before); the dependency's final state ('completed', 'failed',
--          'cancelled' or 'expired': nothing written); 'missing' when there is no such job
--          (nothing written)
-- Errors:  EMQVERSION keyspace of another major version; NOPERM the ACL denies SADD or
--          HINCRBY (before any write)
--@include common
--@include deps

if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
local state = redis.call('HGET', KEYS[1], 'state')
if state and EMQ_ENDED[state] then return state end
if redis.call('SISMEMBER', KEYS[2], ARGV[2]) == 1 then return 'linked' end
local denied = emq_deps_denied({{'SADD', KEYS[2], 'm'}, {'HINCRBY', KEYS[3], 'f', '1'}})
if denied then return redis.error_reply(denied) end
local err = emq_fence(KEYS[4], ARGV[3])
if err then return redis.error_reply(err) end
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
return 'linked'
