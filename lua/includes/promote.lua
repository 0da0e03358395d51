-- includes/promote.lua: release due delayed jobs of one queue to its pending set, on the
-- server clock: promote.lua's move for one queue, and promote_many.lua's for each of many.
-- Each job rejoins pending with its original score (priority tier + arrival counter), so
-- released jobs run in mint order within their tier. A parked job's hash holds no state
-- and no run-at (its delayed score has it): the release stamps 'run_at', so the job's wait
-- is measured from when it became due.
--
-- The ids are the caller's ARGV[a0 + 1 .. a0 + n] and their job hashes KEYS[k0 + 1 .. k0 + n]
-- (read in place: no copy of a list the caller sizes). Every check that can fail is the
-- caller's, made before its first write; nothing here refuses.

-- The set writes go out once per CHUNK members (Lua's unpack() has a stack limit), so per
-- job only what cannot be batched is left: its hash's read and write. (Only commands of the
-- README's least-privilege ACL are used: no ZMSCORE.)
local EMQ_PROMOTE_CHUNK = 4000
-- Up to this many ids, the due head is popped (emq_promote_popped).
local EMQ_PROMOTE_FEW = 16

-- A few ids (at most EMQ_PROMOTE_FEW), as due.lua read them a moment ago, are usually
-- exactly the due head of delayed: pop that head (one ZPOPMIN reads and removes it) and,
-- when it is exactly the listed ids, all due, they are taken off already. Else the popped
-- members go back with their scores (a pop cannot fail half-way, nor can its undo) and
-- the ids are looked up one by one. Returns ``(due, one_ms, removed)`` as emq_promote_due,
-- or nil when the head was not the list.
local function emq_promote_popped(kd, bound, a0, n)
  local popped = redis.call('ZPOPMIN', kd, n)
  local exact = #popped == 2 * n and tonumber(popped[2 * n]) <= bound
  for j = 1, n do
    if not exact then break end
    exact = popped[2 * j - 1] == ARGV[a0 + j]
  end
  if exact then
    local due = {}
    for j = 1, n do due[j] = popped[2 * j] end
    local run_at = emq_unpack_delayed(popped[2])
    if run_at == emq_unpack_delayed(popped[2 * n]) then
      return due, emq_int(run_at), 'popped'
    end
    return due, nil, 'popped'
  end
  if #popped > 0 then
    local back = {}
    for i = 1, #popped, 2 do
      back[i], back[i + 1] = popped[i + 1], popped[i]
    end
    redis.call('ZADD', kd, unpack(back))  -- at most 2 * EMQ_PROMOTE_FEW values
  end
  return nil
end

-- Which listed ids are still due: ``(due, one_ms, removed)``. due[j] is the j-th id's
-- delayed score (or true when all share one run-at ms: one_ms). removed says how they
-- leave delayed: 'popped' (gone already), a score (the due head up to it: one
-- ZREMRANGEBYSCORE) or false (one ZREM of the due ids). A few ids are popped
-- (emq_promote_popped). A longer list is usually exactly the due head that due.lua just
-- read (one more member is read to see what follows it), so one ZRANGEBYSCORE confirms
-- it and, when no member after it shares its last score, one ZREMRANGEBYSCORE takes it
-- off. Ids outside that head (a stale list) get a ZSCORE each and a ZREM. An id missing
-- from delayed, not yet due, or listed twice is skipped. A long list reads no scores with
-- its head: a score reply costs Redis a float print and Lua a parse, more than the job's
-- own hash write; three ZSCOREs read what it needs.
local function emq_promote_due(kd, bound, a0, n)
  if n > 0 and n <= EMQ_PROMOTE_FEW then
    local due, one_ms, removed = emq_promote_popped(kd, bound, a0, n)
    if due then return due, one_ms, removed end
  end
  local head = redis.call('ZRANGEBYSCORE', kd, '-inf', bound, 'LIMIT', 0, n + 1)
  local exact = n > 0 and #head >= n
  for j = 1, n do
    if not exact then break end
    exact = head[j] == ARGV[a0 + j]
  end
  local due, one_ms, by_score = {}, nil, false
  if exact then
    local first = redis.call('ZSCORE', kd, head[1])
    local last = redis.call('ZSCORE', kd, head[n])
    local after = head[n + 1] and redis.call('ZSCORE', kd, head[n + 1])
    if not after or after ~= last then by_score = last end
    local run_at = emq_unpack_delayed(first)
    if run_at == emq_unpack_delayed(last) then
      for j = 1, n do due[j] = true end
      return due, emq_int(run_at), by_score
    end
  end
  local in_head, seen = {}, {}  -- id -> delayed score; ids met already
  local scored = redis.call('ZRANGEBYSCORE', kd, '-inf', bound, 'WITHSCORES', 'LIMIT', 0, n)
  for i = 1, #scored, 2 do in_head[scored[i]] = scored[i + 1] end
  for j = 1, n do
    local id = ARGV[a0 + j]
    if not seen[id] then
      seen[id] = true
      local score = in_head[id] or redis.call('ZSCORE', kd, id)
      if score and tonumber(score) <= bound then due[j] = score end
    end
  end
  return due, nil, by_score
end

-- Move the due ones of the n ids from delayed kd to pending kp (a flat set or a group's
-- lane), with their 'promoted' events on ke (cap: emq_events_cap's) and a wake on marker km;
-- returns how many were released. Per job, in list order: its pending score and its run-at
-- stamp (the text made once per delayed score met: a batch shares a few). A due id whose
-- hash is gone still leaves delayed (an orphan) but is not released. The events go in
-- batched entries (emq_events_batched: one per 16 jobs), trimmed once at the end (a single
-- entry, as emq_event writes it, by its own XADD).
local function emq_promote_ids(kd, kp, km, ke, cap, bound, a0, k0, n)
  local due, one_ms, removed = emq_promote_due(kd, bound, a0, n)
  local gone, scored = {}, {}  -- ids leaving delayed; (ps, id) pairs joining pending
  local released = {}  -- ids joining pending, for their batched 'promoted' events
  local last_score, run_at = nil, nil
  for j = 1, n do
    local score = due[j]
    if score then
      local id, key = ARGV[a0 + j], KEYS[k0 + j]
      gone[#gone + 1] = id
      local ps = redis.call('HGET', key, 'ps')
      if ps then
        scored[#scored + 1] = ps
        scored[#scored + 1] = id
        if one_ms then
          run_at = one_ms
        elseif score ~= last_score then
          last_score, run_at = score, emq_int(emq_unpack_delayed(score))
        end
        redis.call('HSET', key, 'run_at', run_at)
        released[#released + 1] = id
      end
    end
  end
  local moved = #released
  if moved <= EMQ_EVENT_BATCH then  -- at most one entry: its XADD trims as it appends
    if moved > 0 then emq_event(ke, cap, 'promoted', 'ids', cjson.encode(released)) end
  else
    emq_events_batched(ke, cap, 'promoted', released)
    emq_trim_events(ke, cap)
  end
  local chunk = EMQ_PROMOTE_CHUNK
  if removed == 'popped' then  -- taken off delayed already
  elseif removed then
    redis.call('ZREMRANGEBYSCORE', kd, '-inf', removed)
  else
    for s = 1, #gone, chunk do
      redis.call('ZREM', kd, unpack(gone, s, math.min(s + chunk - 1, #gone)))
    end
  end
  for s = 1, #scored, chunk do  -- chunk is even: a (ps, id) pair never splits
    redis.call('ZADD', kp, unpack(scored, s, math.min(s + chunk - 1, #scored)))
  end
  if moved > 0 then emq_wake(km) end
  return moved
end
