-- includes/dedupe.lua: the optional extras of an enqueue: an expiry deadline
-- and a deduplication key. Shared by enqueue.lua and enqueue_group.lua. Needs common.lua.
--
-- Expiry: a job enqueued with `expires` E ms stores `exp` = its run-at + E (server ms);
-- start.lua ends it as `expired` instead of starting it when its first start comes later.
--
-- Deduplication: the queue's `dedupe` hash maps a key to the job holding it. The key's job
-- stores `ddk` (the key) and, with a window T, `ddu` = admission + T (server ms). A new
-- enqueue with the key is judged against that job while it is waiting or active (and
-- before `ddu`): `drop` writes nothing, `extend` writes only `ddu` = now + T, `replace`
-- gives a still-waiting job the new payload, run-at and expiry (and `ddu` = now + T); an
-- active job's key passes to the new job, which is admitted. A job that ended (completed,
-- failed, cancelled, expired) or vanished, or whose window closed, holds the key no more:
-- the new job is admitted and takes it. The caller names the job it read in the hash
-- (`expected`) so that job's hash is a declared key; when the hash says otherwise now
-- (a racing producer took the key), the script writes nothing and answers "stale": the
-- caller reads the hash again and re-sends.

local EMQ_DEDUPE_MODES = {drop = true, replace = true, extend = true}

-- A positive integer ms argument, '' (none) or an error.
local function emq_opt_ms(arg, what)
  if arg == nil or arg == '' then return nil end
  local v = tonumber(arg)
  if not v or v < 1 or v % 1 ~= 0 or v > 2199023255551 then
    return nil, 'EMQINPUT ' .. what .. ' must be a positive integer ms'
  end
  return v
end

-- Parse the extras: `count` of them were sent (the caller's #ARGV past its fixed
-- arguments): expires ms, then dedupe key, expected current job id, window ms and mode
-- ('' / absent: none). Returns an error text, or nil and the table (nil when there are no
-- extras).
local function emq_extras(count, expires, key, expected, window_ms, mode)
  if count < 1 then return nil, nil end
  local exp, e1 = emq_opt_ms(expires, 'expires')
  if e1 then return e1 end
  local x = {exp = exp}
  if count == 1 then return nil, x end
  if count ~= 5 then return 'EMQINPUT dedupe needs key, expected id, window and mode' end
  local window, e2 = emq_opt_ms(window_ms, 'dedupe window')
  if e2 then return e2 end
  if key == '' or #key > 1024 then return 'EMQINPUT a dedupe key holds 1 to 1024 bytes' end
  if not EMQ_DEDUPE_MODES[mode] then
    return 'EMQINPUT dedupe mode must be drop, replace or extend'
  end
  if expected ~= '' and string.sub(expected, 1, 3) ~= 'JOB' then
    return 'EMQKIND job id must start with JOB'
  end
  x.key, x.expected, x.window, x.mode = key, expected, window, mode
  return nil, x
end

-- Judge a dedupe key before any write: 'stale' (the hash names another job than
-- x.expected), 'admit' (no live holder: admit the new job), 'drop', 'extend' or 'replace'
-- (then x.where says where the waiting job is: 'delayed', 'pending', or 'deps' for a job
-- waiting on its dependencies, and x.ps its pending score). `cur` is the expected
-- job's hash, `lane` the pending set (or group lane) the caller declared, x.group the
-- caller's group (nil: none): a replace must name the waiting job's own group.
local function emq_dedupe_verdict(x, kdedupe, cur, kactive, lane, delayed, now)
  local holder = redis.call('HGET', kdedupe, x.key)
  if (holder or '') ~= x.expected then return 'stale' end
  if not holder then return 'admit' end
  local h = redis.call('HMGET', cur, 'state', 'ddu', 'ps', 'group')
  local state = h[1]
  if not h[3] or state == 'completed' or state == 'failed' or state == 'cancelled'
      or state == 'expired' then
    return 'admit'  -- gone (trimmed, deleted) or ended: the key is free
  end
  local until_ms = tonumber(h[2])
  if until_ms and now >= until_ms then return 'admit' end  -- its window closed
  if x.mode ~= 'replace' then return x.mode end
  if state == 'active' or redis.call('ZSCORE', kactive, holder) then
    return 'admit'  -- running (or leased): the new job runs after it and takes the key
  end
  if (h[4] or '') ~= (x.group or '') then  -- it waits in another lane than the one declared
    return nil, 'EMQINPUT dedupe replace: the waiting job ' .. holder .. ' is in group ' ..
      (h[4] and ('\'' .. h[4] .. '\'') or 'none') .. ': enqueue the replacement with that group'
  end
  x.ps = h[3]
  if redis.call('ZSCORE', delayed, holder) then
    x.where = 'delayed'
  elseif redis.call('ZSCORE', lane, holder) then
    x.where = 'pending'
  else
    x.where = 'deps'  -- waiting on its dependencies (or on no set at all: payload only)
  end
  return 'replace'
end

-- The ACL of the writes a dedupe verdict makes (before the first write); nil when allowed.
local function emq_dedupe_denied(acl_arg, kdedupe, cur, lane, delayed)
  local check = redis.acl_check_cmd
  if acl_arg == '0' or not check then return nil end
  if check('HSET', kdedupe, 'f', 'v') and check('HSET', cur, 'f', 'v')
      and check('HDEL', cur, 'f') and check('ZREM', lane, 'm') and check('ZREM', delayed, 'm') then
    return nil
  end
  return 'NOPERM this user may not run every command a dedupe enqueue writes with ' ..
    '(HSET, HDEL, ZREM on the queue keys): nothing was written'
end

-- After admitting job `id` (hash `job_key`) at `now`, due at `run_at`: store its expiry and
-- dedupe fields, and give it the key.
local function emq_extras_keep(x, kdedupe, job_key, id, run_at, now)
  local fields = {}
  if x.exp then
    fields[#fields + 1] = 'exp'
    fields[#fields + 1] = emq_int(run_at + x.exp)
  end
  if x.key then
    redis.call('HSET', kdedupe, x.key, id)
    fields[#fields + 1] = 'ddk'
    fields[#fields + 1] = x.key
    if x.window then
      fields[#fields + 1] = 'ddu'
      fields[#fields + 1] = emq_int(now + x.window)
    end
  end
  if #fields > 0 then redis.call('HSET', job_key, unpack(fields)) end
end

-- Debounce: the waiting job `holder` (hash `cur`) gets the new payload, encoding, run-at
-- and expiry, and its window restarts. `dscore` is the delayed score for run_at (read
-- before the first write; nil when due now). Returns the state it waits in.
local function emq_dedupe_replace(x, cur, holder, lane, delayed, marker, payload, enc,
                                  run_at, now, dscore)
  redis.call('HSET', cur, 'payload', payload)
  if enc == 'j' then redis.call('HDEL', cur, 'enc') else redis.call('HSET', cur, 'enc', enc) end
  if x.exp then
    redis.call('HSET', cur, 'exp', emq_int(run_at + x.exp))
  else
    redis.call('HDEL', cur, 'exp')
  end
  if x.window then redis.call('HSET', cur, 'ddu', emq_int(now + x.window)) end
  if x.where == 'deps' then return 'waiting_deps' end  -- it runs when its deps let it
  if dscore then
    redis.call('ZREM', lane, holder)
    redis.call('ZADD', delayed, dscore, holder)
    redis.call('HDEL', cur, 'run_at')  -- a parked job's run-at is its delayed score
    emq_wake_at(marker, run_at)
    return 'scheduled'
  end
  if x.where == 'delayed' then
    redis.call('ZREM', delayed, holder)
    redis.call('ZADD', lane, x.ps, holder)
    redis.call('HSET', cur, 'run_at', emq_int(now))
    emq_wake(marker)
  end
  return 'pending'
end
