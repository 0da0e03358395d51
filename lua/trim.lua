-- trim.lua: retention: delete finished jobs the caller picked (oldest first)
-- from a completed or failed set, together with their hashes.
--
-- KEYS[1] finished zset  emq:{q}:completed or emq:{q}:failed
-- KEYS[2..] job hashes   emq:{q}:job:<id>, one per ARGV id, same order
-- ARGV[1..] job ids
-- Returns: number of jobs deleted
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts

if #ARGV ~= #KEYS - 1 then
  return redis.error_reply('EMQINPUT trim needs one job key per id')
end
local n = 0
for i = 1, #ARGV do
  -- only jobs still in the finished set: a retried job has left it
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('DEL', KEYS[i + 1])
    n = n + 1
  end
end
return n
