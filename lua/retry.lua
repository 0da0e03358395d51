-- retry.lua: send a failed job back to pending with a fresh set of attempts
-- (the CLI's `emqfast retry`).
--
-- KEYS[1] job hash       emq:{q}:job:<id>
-- KEYS[2] failed zset    emq:{q}:failed
-- KEYS[3] pending zset   emq:{q}:pending
-- KEYS[4] marker zset    emq:{q}:marker
-- KEYS[5] meta hash      emq:{q}:meta
-- KEYS[6] events stream  emq:{q}:events
-- ARGV[1] job id
-- ARGV[2] keyspace version of the caller
-- Returns: 1
-- Errors:  EMQNOJOB unknown id; EMQSTATE the job is not in the failed set;
--          EMQVERSION keyspace of another major version
--@include common

if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('EMQNOJOB no job ' .. ARGV[1])
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return redis.error_reply('EMQSTATE job ' .. ARGV[1] .. ' is not failed')
end
local err = emq_fence(KEYS[5], ARGV[2])
if err then return redis.error_reply(err) end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'attempts', '0', 'stalls', '0')
-- waiting again: its set says where; a cancel that came too late for the failed run
-- (its 'cancel' mark) must not stop the fresh one
redis.call('HDEL', KEYS[1], 'finished', 'state', 'cancel')
redis.call('ZADD', KEYS[3], redis.call('HGET', KEYS[1], 'ps'), ARGV[1])
emq_wake(KEYS[4])
emq_event(KEYS[6], emq_events_cap(KEYS[5]), 'retried', 'id', ARGV[1])
return 1
