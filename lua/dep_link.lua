-- dep_link.lua: link a waiting job to one of its dependencies, in the dependency's slot:
-- the dependent joins the dependency's dependents set and the dependency is
-- counted on the queue's dependents hash, which the finish hook (includes/finished.lua)
-- reads when the dependency ends for good: it then queues "<outcome>\0<id>" on the outbox.
-- Idempotent: a link sent again (a re-run, the crash repair) adds nothing. A dependency
-- that has already ended is not linked: its state is returned and the caller resolves the
-- dependent at once (dep_resolve.lua). Atomic with the finish hook (one slot), so a
-- dependency ends either before the link (seen here) or after it (queued on the outbox).
--
-- KEYS[1] job_key             dependency's job hash emq:{d}:job:<dep id>
-- KEYS[2] its_dependents_key  its dependents set emq:{d}:job:<dep id>:dependents
-- KEYS[3] dependents_key      dependents hash emq:{d}:dependents
-- KEYS[4] meta_key            meta hash       emq:{d}:meta
-- ARGV[1] dep_id              the dependency's job id
-- ARGV[2] dependent           the dependent, "<queue>\0<job id>"
-- ARGV[3] version             keyspace version of the caller
-- Returns: 'linked' (now or before); for a dependency that has ended (nothing written):
--          {'completed', its result (nil: none stored)} when it completed, else its final
--          state ('failed', 'cancelled' or 'expired'); 'missing' when there is no such job
--          (nothing written)
-- Errors:  EMQVERSION keyspace of another major version; NOPERM the ACL denies SADD or
--          HINCRBY (before any write)
--@include common
--@include deps

local job_key = KEYS[1]
local its_dependents_key = KEYS[2]
local dependents_key = KEYS[3]
local meta_key = KEYS[4]
local dep_id = ARGV[1]
local dependent = ARGV[2]
local version = ARGV[3]

if redis.call('EXISTS', job_key) == 0 then return 'missing' end
local state = redis.call('HGET', job_key, 'state')
if state == 'completed' then return {state, redis.call('HGET', job_key, 'result')} end
if state and EMQ_ENDED[state] then return state end
if redis.call('SISMEMBER', its_dependents_key, dependent) == 1 then return 'linked' end
local denied = emq_deps_denied({{'SADD', its_dependents_key, 'm'},
                                {'HINCRBY', dependents_key, 'f', '1'}})
if denied then return redis.error_reply(denied) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
redis.call('SADD', its_dependents_key, dependent)
redis.call('HINCRBY', dependents_key, dep_id, 1)
return 'linked'
