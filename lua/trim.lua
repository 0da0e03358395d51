-- trim.lua: retention: delete finished jobs the caller picked (oldest first)
-- from a completed or failed set, together with their hashes.
--
-- KEYS[1] finished zset  emq:{q}:completed or emq:{q}:failed
-- KEYS[2] meta hash      emq:{q}:meta
-- KEYS[3..] job hashes   emq:{q}:job:<id>, one per ARGV[2..] id, same order
-- ARGV[1] keyspace version of the caller
-- ARGV[2..] job ids
-- Returns: number of jobs deleted
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts; EMQVERSION keyspace of another major version
--@include common

if #ARGV < 1 or #ARGV - 1 ~= #KEYS - 2 then
  return redis.error_reply('EMQINPUT trim needs one job key per id')
end
local err = emq_fence(KEYS[2], ARGV[1])
if err then return redis.error_reply(err) end
local n = 0
for i = 2, #ARGV do
  -- only jobs still in the finished set: a retried job has left it
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('DEL', KEYS[i + 1])
    n = n + 1
  end
end
return n
