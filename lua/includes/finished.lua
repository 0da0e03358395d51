-- includes/finished.lua: what happens when jobs end for good (completed, failed for the
-- last time, cancelled, expired): their waiters (ref.wait) are told on the job's done
-- channel and their dependents are queued on the outbox for release. Both lookups are one
-- HLEN per call while nobody waits and nothing depends, so plain jobs pay nothing per job.
--
-- A script calls emq_finish_prepare before its first write (the checks that can fail) and
-- emq_finished(hook, <the same three keys>, ids, outcome) after it ended jobs. The three
-- keys are the queue's `waiters` hash, `dependents` hash and `outbox` list; a channel is
-- not a key, so the done channel `emq:{q}:done:<id>` is named from the waiters key's prefix.

-- Before the first write: nil when nothing waits or depends on any job of the queue (the
-- common case: nothing more to do), else the hook emq_finished uses; or nil plus an error
-- reply text when the ACL denies a command the hook would need (7.0+ can tell beforehand)
-- or the outbox it would push to holds another type (EMQKEYTYPE).
local function emq_finish_prepare(kw, kd, ko)
  local w = redis.call('HLEN', kw) > 0
  local d = redis.call('HLEN', kd) > 0
  if not w and not d then return nil end
  local wrong = d and emq_key_type_error(ko, 'list')
  if wrong then return nil, wrong end
  local base = string.sub(kw, 1, #kw - #'waiters')
  if redis.acl_check_cmd then
    if w and not redis.acl_check_cmd('PUBLISH', base .. 'done:x', 'x') then
      return nil, 'NOPERM this user has no permission to PUBLISH on ' .. base .. 'done:*'
    end
    if d and not redis.acl_check_cmd('RPUSH', ko, 'x') then
      return nil, 'NOPERM this user has no permission to run the RPUSH command'
    end
  end
  return {base = base, w = w, d = d}
end

-- The ids of one chunk that have an entry in hash `key`; their entries are deleted.
local function emq_finish_take(counts, chunk)
  local found = {}
  local vals = redis.call('HMGET', counts, unpack(chunk))
  for i = 1, #chunk do
    if vals[i] then found[#found + 1] = chunk[i] end
  end
  if #found > 0 then redis.call('HDEL', counts, unpack(found)) end
  return found
end

-- After jobs `ids` ended for good with `outcome`: publish the outcome to each waited job's
-- done channel, and queue "<outcome>\0<id>" on the outbox for each job with dependents
-- (drained by the workers' dependency step). Chunked: Lua's unpack() has a stack limit.
local function emq_finished(hook, kw, kd, ko, ids, outcome)
  if not hook then return end
  for s = 1, #ids, 1000 do
    local chunk = {}
    for i = s, math.min(s + 999, #ids) do chunk[#chunk + 1] = ids[i] end
    if hook.w then
      for _, id in ipairs(emq_finish_take(kw, chunk)) do
        redis.call('PUBLISH', hook.base .. 'done:' .. id, outcome)
      end
    end
    if hook.d then
      local told = emq_finish_take(kd, chunk)
      for i = 1, #told do told[i] = outcome .. '\0' .. told[i] end
      if #told > 0 then redis.call('RPUSH', ko, unpack(told)) end
    end
  end
end
