-- retry.lua: send a failed job back to pending with a fresh set of attempts
-- (the CLI's `emqfast retry`).
--
-- KEYS[1] job_key      job hash        emq:{q}:job:<id>
-- KEYS[2] failed_key   failed zset     emq:{q}:failed
-- KEYS[3] pending_key  pending zset    emq:{q}:pending
-- KEYS[4] marker_key   marker zset     emq:{q}:marker
-- KEYS[5] meta_key     meta hash       emq:{q}:meta
-- KEYS[6] events_key   events stream   emq:{q}:events
-- ARGV[1] id           job id
-- ARGV[2] version      keyspace version of the caller
-- Returns: 1
-- Errors:  EMQNOJOB unknown id; EMQSTATE the job is not in the failed set;
--          EMQDEPFAILED the job failed because a dependency did not complete (run again,
--          its handler would get no result for it: retry the dependency instead);
--          EMQVERSION keyspace of another major version; EMQKEYTYPE the pending set,
--          the marker or the events stream holds another type (before any write)
--@include common

local job_key = KEYS[1]
local failed_key = KEYS[2]
local pending_key = KEYS[3]
local marker_key = KEYS[4]
local meta_key = KEYS[5]
local events_key = KEYS[6]
local id = ARGV[1]
local version = ARGV[2]

if redis.call('EXISTS', job_key) == 0 then
  return redis.error_reply('EMQNOJOB no job ' .. id)
end
if not redis.call('ZSCORE', failed_key, id) then
  return redis.error_reply('EMQSTATE job ' .. id .. ' is not failed')
end
if redis.call('HGET', job_key, 'error') == 'dependency failed' then
  return redis.error_reply('EMQDEPFAILED job ' .. id .. ' failed because a dependency ' ..
    'did not complete: retry the dependency, then enqueue this job again')
end
-- the keys written after the first write, by type (the job hash and failed set are read
-- above)
local cap = emq_events_cap(meta_key)
local wrong = emq_key_type_error(pending_key, 'zset') or emq_key_type_error(marker_key, 'zset')
  or (cap and emq_key_type_error(events_key, 'stream'))
if wrong then return redis.error_reply(wrong) end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
redis.call('ZREM', failed_key, id)
redis.call('HSET', job_key, 'attempts', '0', 'stalls', '0')
-- waiting again: its set says where; a cancel that came too late for the failed run
-- (its 'cancel' mark) must not stop the fresh one
redis.call('HDEL', job_key, 'finished', 'state', 'cancel')
redis.call('ZADD', pending_key, redis.call('HGET', job_key, 'ps'), id)
emq_wake(marker_key)
emq_event(events_key, cap, 'retried', 'id', id)
return 1
