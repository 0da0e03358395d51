-- cancel.lua: remove a job that has not started (scheduled or pending), atomically.
-- Active jobs are not cancelled here (their handler owns them until it ends).
--
-- KEYS[1] job hash       emq:{q}:job:<id>
-- KEYS[2] pending zset   emq:{q}:pending
-- KEYS[3] delayed zset   emq:{q}:delayed
-- ARGV[1] job id
-- Returns: 1 cancelled (job deleted), 0 not cancellable (unknown, active or finished)

if redis.call('ZREM', KEYS[2], ARGV[1]) + redis.call('ZREM', KEYS[3], ARGV[1]) > 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
