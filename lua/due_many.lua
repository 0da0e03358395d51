-- due_many.lua: read-only: the due delayed ids of many queues on one standalone server
-- (their keys lie in many Cluster slots: on Cluster, due.lua runs per queue), on the server
-- clock, so promote_many can declare their job keys to promote.lua. One EVALSHA for many
-- queues instead of one per queue: a queue's read is two commands, not a script run.
-- At most 4000 ids in all per call (bounded work): a queue whose limit no longer fits in
-- what is left of that budget is not read, and says so, for the caller's next call.
--
-- KEYS[1..] per queue, a pair: emq:{q}:delayed zset (packed run-at scores), then
--          emq:{q}:meta hash (whether the queue has ever held grouped jobs); at most 1000 pairs
-- ARGV[1..] per queue, in KEYS order: max ids to read, integer in [1, 4000]
-- Returns: {now_ms, then per queue: grouped 0/1, count, id1, ..., id<count>} oldest first;
--          count -1 (no ids follow): the queue was not read (the call's budget was spent)
-- Errors:  EMQINPUT KEYS not one pair per ARGV limit, more than 1000 queues, or a limit
--          not an integer in [1, 4000]
--@include common

local nq = #ARGV
if nq < 1 or #KEYS ~= 2 * nq or nq > 1000 then
  return redis.error_reply('EMQINPUT due_many takes 1 to 1000 queues: a key pair per limit')
end
for i = 1, nq do
  local limit = tonumber(ARGV[i])
  if not limit or limit < 1 or limit > EMQ_MAX_BATCH or limit % 1 ~= 0 then
    return redis.error_reply('EMQINPUT limit must be an integer in [1, ' .. EMQ_MAX_BATCH .. ']')
  end
end
local now = emq_now()
local bound = emq_int(emq_due_bound(now))  -- one text for every read
local out, budget = {now}, EMQ_MAX_BATCH
for i = 1, nq do
  local limit = tonumber(ARGV[i])
  if limit > budget then
    out[#out + 1] = 0
    out[#out + 1] = -1
  else
    local ids = redis.call('ZRANGEBYSCORE', KEYS[2 * i - 1], '-inf', bound, 'LIMIT', '0', ARGV[i])
    local grouped = 0
    if #ids > 0 and redis.call('HGET', KEYS[2 * i], 'grouped') == '1' then grouped = 1 end
    out[#out + 1] = grouped
    out[#out + 1] = #ids
    for j = 1, #ids do out[#out + 1] = ids[j] end
    budget = budget - #ids
  end
end
return out
