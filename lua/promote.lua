-- promote.lua: release due delayed jobs to pending, on the server clock. Each
-- job rejoins pending with its original score (priority tier + arrival counter),
-- so released jobs run in mint order within their tier. A parked job's hash holds
-- no state and no run-at (its delayed score has it): the release stamps 'run_at',
-- so the job's wait is measured from when it became due.
--
-- KEYS[1] delayed zset   emq:{q}:delayed
-- KEYS[2] pending zset   emq:{q}:pending
-- KEYS[3] marker zset    emq:{q}:marker
-- KEYS[4] meta hash      emq:{q}:meta
-- KEYS[5] events stream  emq:{q}:events
-- KEYS[6..] job hashes   emq:{q}:job:<id>, one per ARGV[2..] id, same order
-- ARGV[1] keyspace version of the caller
-- ARGV[2..] job ids (from due.lua; re-checked here, so a stale list is harmless), at most 4000
-- Returns: number of jobs released
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts or more than 4000 ids;
--          EMQVERSION keyspace of another major version
--@include common

if #ARGV < 1 or #ARGV - 1 ~= #KEYS - 5 then
  return redis.error_reply('EMQINPUT promote needs one job key per id')
end
if #ARGV - 1 > EMQ_MAX_BATCH then
  return redis.error_reply('EMQINPUT promote takes at most ' .. EMQ_MAX_BATCH .. ' ids per call')
end
local err = emq_fence(KEYS[4], ARGV[1])
if err then return redis.error_reply(err) end
local bound = emq_due_bound(emq_now())
local n = #ARGV - 1
-- The set writes go out once per CHUNK members (Lua's unpack() has a stack limit), so
-- per job only what cannot be batched is left: its hash's read and write.
-- (Only commands of the README's least-privilege ACL are used: no ZMSCORE.)
local CHUNK = 4000

-- Which listed ids are still due. Usually the list is exactly the due head of delayed
-- that due.lua just read (one more member is read to see what follows it), so one
-- ZRANGEBYSCORE confirms it and, when no member after it shares its last score, one
-- ZREMRANGEBYSCORE takes it off. Ids outside that head (a stale list) get a ZSCORE each
-- and a ZREM. An id missing from delayed, not yet due, or listed twice is skipped.
-- A long list reads no scores with its head: a score reply costs Redis a float print and
-- Lua a parse, more than the job's own hash write; three ZSCOREs read what it needs.
local FEW = 16  -- up to this many ids, the head comes WITHSCORES (cheaper than 3 ZSCOREs)
local step = n <= FEW and 2 or 1  -- head[step * i - step + 1] is the i-th member
local head
if step == 2 then
  head = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', bound, 'WITHSCORES', 'LIMIT', 0, n + 1)
else
  head = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', bound, 'LIMIT', 0, n + 1)
end
local exact = n > 0 and #head >= step * n
for i = 1, n do
  if not exact then break end
  exact = head[step * (i - 1) + 1] == ARGV[i + 1]
end
local due = {}  -- due[i]: ARGV[i] moves (its delayed score, or true: see one_ms)
local one_ms, by_score = nil, false  -- the run-at all due jobs share; the head's last score
if exact then
  local first, last, after
  if step == 2 then
    first, last, after = head[2], head[2 * n], head[2 * n + 2]
  else
    first = redis.call('ZSCORE', KEYS[1], head[1])
    last = redis.call('ZSCORE', KEYS[1], head[n])
    after = head[n + 1] and redis.call('ZSCORE', KEYS[1], head[n + 1])
  end
  if not after or after ~= last then by_score = last end
  local run_at = emq_unpack_delayed(first)
  if run_at == emq_unpack_delayed(last) then one_ms = emq_int(run_at) end
end
if exact and one_ms then
  for i = 2, #ARGV do due[i] = true end
else
  local in_head, seen = {}, {}  -- id -> delayed score; ids met already
  local scored = head  -- the head with its scores (a long list's is read again for them)
  if step == 1 then
    scored = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', bound, 'WITHSCORES', 'LIMIT', 0, n)
  end
  for j = 1, #scored, 2 do in_head[scored[j]] = scored[j + 1] end
  for i = 2, #ARGV do
    local id = ARGV[i]
    if not seen[id] then
      seen[id] = true
      local score = in_head[id] or redis.call('ZSCORE', KEYS[1], id)
      if score and tonumber(score) <= bound then due[i] = score end
    end
  end
end

-- Per job, in list order: its pending score and its run-at stamp (the text made once
-- per delayed score met: a batch shares a few). A due id whose hash is gone still
-- leaves delayed (an orphan) but is not released. The 'promoted' events go in
-- batched entries (emq_events_batched: one per 16 jobs), trimmed once at the end (a
-- single entry, as emq_event writes it, by its own XADD).
local cap = emq_events_cap(KEYS[4])
local gone, scored = {}, {}  -- ids leaving delayed; (ps, id) pairs joining pending
local released = {}  -- ids joining pending, for their batched 'promoted' events
local last_score, run_at = nil, nil
for i = 2, #ARGV do
  local score = due[i]
  if score then
    local id = ARGV[i]
    gone[#gone + 1] = id
    local ps = redis.call('HGET', KEYS[i + 4], 'ps')
    if ps then
      scored[#scored + 1] = ps
      scored[#scored + 1] = id
      if one_ms then
        run_at = one_ms
      elseif score ~= last_score then
        last_score, run_at = score, emq_int(emq_unpack_delayed(score))
      end
      redis.call('HSET', KEYS[i + 4], 'run_at', run_at)
      released[#released + 1] = id
    end
  end
end
local moved = #released
if moved <= EMQ_EVENT_BATCH then  -- at most one entry: its XADD trims as it appends
  if moved > 0 then emq_event(KEYS[5], cap, 'promoted', 'ids', cjson.encode(released)) end
else
  emq_events_batched(KEYS[5], cap, 'promoted', released)
  emq_trim_events(KEYS[5], cap)
end

if by_score then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', by_score)
else
  for s = 1, #gone, CHUNK do
    redis.call('ZREM', KEYS[1], unpack(gone, s, math.min(s + CHUNK - 1, #gone)))
  end
end
for s = 1, #scored, CHUNK do  -- CHUNK is even: a (ps, id) pair never splits
  redis.call('ZADD', KEYS[2], unpack(scored, s, math.min(s + CHUNK - 1, #scored)))
end
if moved > 0 then emq_wake(KEYS[3]) end
return moved
