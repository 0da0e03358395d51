-- enqueue_many.lua: admit a chunk of jobs that share their options in one call, exactly as
-- the same jobs sent one by one through enqueue.lua would be admitted (same fields, same
-- counter values and scores, same replies, the same 'enqueued' events as readers see
-- them), at a fraction of the server cost: one fence, one TIME, one INCRBY, set writes in
-- chunks, one stream entry per 100 jobs of ids minted together.
--
-- KEYS[1] pending_key   pending zset    emq:{q}:pending
-- KEYS[2] delayed_key   delayed zset    emq:{q}:delayed
-- KEYS[3] marker_key    marker zset     emq:{q}:marker
-- KEYS[4] meta_key      meta hash       emq:{q}:meta
-- KEYS[5] counter_key   counter         emq:{q}:counter
-- KEYS[6] events_key    events stream   emq:{q}:events
-- KEYS[7..] job hashes   emq:{q}:job:<id>, one per job, in job order (n = #KEYS - 6 jobs)
-- ARGV[1] version       keyspace version of the caller
-- ARGV[2] acl           '0' skips the ACL check of the commands it writes with; else checks
-- ARGV[3] opts          options shared by every job (as enqueue.lua's ARGV[4]; '' = library
--          defaults)
-- ARGV[4] priority_arg  priority, integer 0 .. 2^21-1
-- ARGV[5] mode          'now', 'at' (ARGV[6] = absolute run-at epoch ms) or 'in' (delay ms)
-- ARGV[6] run_at_arg    run-at or delay in ms ('0' for mode 'now')
-- ARGV[7] shared_enc    payload encoding of every job ('j' JSON, not stored; 'b' bytes), or '' when
--         each job carries its own
-- ARGV[8..] per job i, in KEYS order: id (must start with JOB), payload, and its encoding
--         when ARGV[7] is '' (3 values per job, else 2); read by index, but:
--   ARGV[8] first_id  the first job's id (the shared checks run once, with it)
-- Returns: one status per job, in order: 1 admitted as pending, 2 admitted as scheduled,
--          0 duplicate (the id exists, or came earlier in this call: nothing written for it)
-- Errors:  EMQINPUT ARGV does not hold 2 (or 3) values per job key, no job, or more than 4000 jobs;
--          EMQKIND an id without the JOB brand (EMQINPUT: with a ':'); EMQRANGE priority or run-at
--          out of range; EMQINPUT malformed mode/number; EMQVERSION keyspace of another major
--          version; NOPERM the user's ACL denies a command it writes with; EMQKEYTYPE a queue key
--          it writes holds another type (or WRONGTYPE from a key it reads). Each refuses the
--          whole call before any write: one bad job writes nothing at all, for any job.
--@include common
--@include admit

local pending_key = KEYS[1]
local delayed_key = KEYS[2]
local marker_key = KEYS[3]
local meta_key = KEYS[4]
local counter_key = KEYS[5]
local events_key = KEYS[6]
local version = ARGV[1]
local acl = ARGV[2]
local opts = ARGV[3]
local priority_arg = ARGV[4]
local mode = ARGV[5]
local run_at_arg = ARGV[6]
local shared_enc = ARGV[7]
local first_id = ARGV[8]

local n = #KEYS - 6
local stride = 2
if shared_enc == '' then stride = 3 end
if n < 1 or #ARGV ~= 7 + stride * n then
  return redis.error_reply('EMQINPUT enqueue_many needs one job key per (id, payload)')
end
if n > EMQ_MAX_BATCH then
  return redis.error_reply('EMQINPUT enqueue_many takes at most ' .. EMQ_MAX_BATCH ..
    ' jobs per call')
end
-- the shared checks (and TIME) once, with the first id; the other ids' brand below
local bad, priority, run_at, now = emq_check_admission(first_id, priority_arg, mode, run_at_arg)
if bad then return redis.error_reply(bad) end

-- Set members go out CHUNK arguments per command (never unpack() a table the caller sizes).
local CHUNK = 500
-- Which job hashes exist already: one EXISTS per CHUNK keys, and per key only in a chunk
-- where some do (a re-sent or overlapping batch), so a batch of new jobs pays no lookup.
local exists = {}
for lo = 7, #KEYS, CHUNK do
  local hi = math.min(lo + CHUNK - 1, #KEYS)
  if redis.call('EXISTS', unpack(KEYS, lo, hi)) > 0 then
    for j = lo, hi do exists[j - 6] = redis.call('EXISTS', KEYS[j]) == 1 end
  end
end
-- Which jobs are new: an existing id, or one listed earlier in this call, is a duplicate.
local new, seen, fresh = {}, {}, 0
for i = 1, n do
  local id = ARGV[8 + (i - 1) * stride]
  local bad_id = emq_new_id_error(id)
  if bad_id then return redis.error_reply(bad_id) end
  if not seen[id] and not exists[i] then
    new[i] = true
    fresh = fresh + 1
  end
  seen[id] = true
end

local statuses = {}
if fresh == 0 then  -- every job a duplicate: nothing to write (no fence stamp either)
  for i = 1, n do statuses[i] = 0 end
  return statuses
end
local cap = emq_events_cap(meta_key)
local dscore = emq_admit_score(delayed_key, run_at, now)
-- The ACL of what an admission writes with (as enqueue.lua checks it, on the first new
-- job's hash), and INCRBY, which draws the counter range here.
local function counter_denied(acl_arg, counter)
  local check = redis.acl_check_cmd
  if acl_arg == '0' or not check or check('INCRBY', counter, '1') then return nil end
  return 'NOPERM this user may not run INCRBY on the queue counter: nothing was written'
end
local first_new = 1
while not new[first_new] do first_new = first_new + 1 end
local denied = emq_admit_denied(acl, dscore, KEYS[6 + first_new], pending_key, delayed_key,
                                marker_key, counter_key, events_key, cap ~= nil)
  or counter_denied(acl, counter_key)
  or emq_admit_types(dscore, pending_key, marker_key, events_key, cap ~= nil)
if denied then return redis.error_reply(denied) end
local err = emq_fence(meta_key, version)  -- its version stamp is the first write
if err then return redis.error_reply(err) end

-- The counter values enqueue.lua's INCR per new job would have drawn, in one INCRBY.
local seq = redis.call('INCRBY', counter_key, fresh) - fresh
local set_key, status, slot0 = pending_key, 1, nil
if dscore then
  set_key, status = delayed_key, 2
  slot0 = dscore - emq_pack_delayed(run_at, 0)  -- the ms's next slot, as emq_delayed_score
end
local first = emq_pack_delayed(run_at, 0)
local tier = priority * 4294967296
local created = emq_int(now)
-- A job's hash, fields in enqueue.lua's order (defaults not stored: see admit.lua).
local function write_job(key, payload, ps, enc)
  if enc == 'j' then
    if opts == '' then
      redis.call('HSET', key, 'payload', payload, 'ps', ps, 'created', created)
    else
      redis.call('HSET', key, 'payload', payload, 'ps', ps, 'created', created, 'opts', opts)
    end
  elseif opts == '' then
    redis.call('HSET', key, 'payload', payload, 'ps', ps, 'created', created, 'enc', enc)
  else
    redis.call('HSET', key, 'payload', payload, 'ps', ps, 'created', created, 'enc', enc,
      'opts', opts)
  end
end
local members, k = {}, 0
for i = 1, n do
  if new[i] then
    local at = 8 + (i - 1) * stride
    local id = ARGV[at]
    seq = seq + 1
    local ps = tier + (seq % 4294967296)
    local enc = shared_enc
    if stride == 3 then enc = ARGV[at + 2] end
    -- (the score goes to ZADD as the text written to the hash: Redis prints a number
    -- argument of redis.call with snprintf, once per job)
    local score = emq_int(ps)
    write_job(KEYS[6 + i], ARGV[at + 1], score, enc)
    if slot0 then
      score = first + math.min(slot0, 4095)
      slot0 = slot0 + 1
    end
    members[k + 1] = score
    members[k + 2] = id
    k = k + 2
    if k >= CHUNK then
      redis.call('ZADD', set_key, unpack(members, 1, k))
      k = 0
    end
    statuses[i] = status
  else
    statuses[i] = 0
  end
end
if k > 0 then redis.call('ZADD', set_key, unpack(members, 1, k)) end
if dscore then emq_wake_at(marker_key, run_at) else emq_wake(marker_key) end

-- The 'enqueued' events, written after the writes (nobody reads the stream inside the
-- script) and trimmed once at the end. When every admitted id has one length and all
-- but its last 4 characters in common (ids minted in one call: JOB + mint ms + process
-- nonce, then a 4-character counter), one entry per EMQ_TAILS_BATCH jobs holds that head
-- once and the tails concatenated: 4 bytes per job in the stream instead of an XADD per
-- job (about a quarter of the call's Redis CPU). Readers (facade/events.py) expand it
-- into one event per job, in job order. Other ids get one entry per job, as enqueue.lua
-- writes them.
local EMQ_TAILS_BATCH = 100
if cap then
  local state = 'pending'
  if dscore then state = 'scheduled' end
  local events = events_key
  local head, width, tails = nil, nil, {}
  for i = 1, n do
    if new[i] then
      local id = ARGV[8 + (i - 1) * stride]
      if not head then  -- (ASCII only: a reader splits the decoded text every 4 characters)
        width = #id
        if width < 8 or string.find(id, '[\128-\255]') then break end
        head = string.sub(id, 1, width - 4)
      elseif #id ~= width or string.sub(id, 1, width - 4) ~= head then
        break
      end
      local tail = string.sub(id, width - 3)
      if string.find(tail, '[\128-\255]') then break end
      tails[#tails + 1] = tail
    end
  end
  if #tails == fresh then
    for s = 1, fresh, EMQ_TAILS_BATCH do
      redis.call('XADD', events, '*', 'event', 'enqueued', 'state', state, 'head', head,
        'tails', table.concat(tails, '', s, math.min(s + EMQ_TAILS_BATCH - 1, fresh)))
    end
  else
    for i = 1, n do  -- emq_event_untrimmed, inlined (no vararg call per job)
      if new[i] then
        redis.call('XADD', events, '*', 'event', 'enqueued', 'id', ARGV[8 + (i - 1) * stride],
          'state', state)
      end
    end
  end
  emq_trim_events(events, cap)
end
return statuses
