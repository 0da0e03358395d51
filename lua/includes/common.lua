-- includes/common.lua: helpers shared by the scripts (inlined by emqfast/scripts.py
-- where a script says "--@include common"). No keys are built here.

-- Bounded work per call: a script handed a list of ids or a count refuses more
-- than this many, so no single call blocks Redis for more than a few ms; callers loop.
local EMQ_MAX_BATCH = 4000

-- Server clock in epoch ms: every "now" comes from here, never from the caller.
local function emq_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Delayed scores: (run_at - EPOCH) * 4096 + 12-bit seq, exact below 2^53
-- (the offset epoch keeps raw epoch-ms * 4096 from passing 2^53 in 2039).
local EMQ_EPOCH = 1704067200000
local EMQ_MAX_OFFSET = 2199023255551 -- 2^41 - 1

local function emq_pack_delayed(run_at, seq)
  local off = run_at - EMQ_EPOCH
  if off < 0 then off = 0 end
  return off * 4096 + (seq % 4096)
end

local function emq_unpack_delayed(score)
  return EMQ_EPOCH + math.floor(tonumber(score) / 4096)
end

-- Score for a new member of the delayed set due at `run_at`: the next free 12-bit slot
-- of that millisecond, so jobs due in the same ms keep their arrival order. (The arrival
-- counter mod 4096 would wrap in the middle of a same-ms burst and reorder it.) Past
-- 4096 members in one ms the slot saturates at 4095 and equal scores fall back to
-- member order, which for minted ids is mint order.
local function emq_delayed_score(delayed, run_at)
  local first = emq_pack_delayed(run_at, 0)
  local last = redis.call('ZREVRANGEBYSCORE', delayed, first + 4095, first, 'WITHSCORES',
    'LIMIT', 0, 1)
  if not last[2] then return first end
  return first + math.min(tonumber(last[2]) - first + 1, 4095)
end

-- Highest delayed score due at `now` (every seq of that millisecond included).
local function emq_due_bound(now)
  return emq_pack_delayed(now, 4095)
end

-- Integer to string without Lua's %.14g rounding of large numbers.
local function emq_int(n)
  return string.format('%.0f', n)
end

-- A new job's id: the JOB brand, and no ':'. A job's own sets extend its hash key
-- emq:{q}:job:<id> with ':deps' and ':dependents', so an id with a ':' could name another
-- job's set (and that job's id this one's). Returns the error text, or nil.
local function emq_new_id_error(id)
  if string.sub(id, 1, 3) ~= 'JOB' then return 'EMQKIND job id must start with JOB' end
  if string.find(id, ':', 1, true) then
    return "EMQINPUT job id must not contain ':' (it separates the parts of a job's keys)"
  end
  return nil
end

-- The boot fence's check, without a read or a write: nil when a caller speaking `version`
-- may use a queue whose meta 'version' field is `have` (false: none yet), else the error.
-- (A script touching many queues reads every 'version' first, checks them all with this,
-- and only then writes: emq_fence reads and stamps one queue's.)
local function emq_fence_check(have, version)
  -- a call site still using an older KEYS/ARGV layout would hand us a job id or a
  -- number here: refuse before anything is written rather than stamp a wrong key
  if type(version) ~= 'string' or not string.match(version, '^[%w_%-]+:%d') then
    return 'EMQINPUT expected a keyspace version (e.g. emqfast:1.0), got ' .. tostring(version)
  end
  if have and string.sub(have, 1, 12) == 'partitioned:' then
    -- the logical queue of a partitioned queue (partitions.lua): its jobs live in its
    -- partitions, so a plain client must not write here
    return 'EMQPARTITIONS queue is partitioned (layout ' .. have .. '): open it with ' ..
      'Queue(name, conn, partitions=P) using the P it was made with'
  end
  if have and string.match(have, '^[^.]*') ~= string.match(version, '^[^.]*') then
    return 'EMQVERSION queue keyspace is ' .. have .. ', this client speaks ' .. version
  end
  return nil
end

-- An EMQKEYTYPE error text when `checked_key` holds another type than `want` ('zset',
-- 'hash' or 'stream'), the type the script writes there (nil: it holds that type, or
-- nothing). A key another writer put under the queue's name would otherwise fail a write
-- half-way through a script, after earlier writes (a job's hash written, its ZADD
-- refused). One O(1) read of that type, a command the least-privilege ACL rule already
-- allows (TYPE is not in it); scripts check only the keys no earlier read has checked.
local function emq_key_type_error(checked_key, want)
  local got
  if want == 'stream' then
    got = redis.pcall('XREVRANGE', checked_key, '+', '+', 'COUNT', 1)
  elseif want == 'hash' then
    got = redis.pcall('HLEN', checked_key)
  else
    got = redis.pcall('ZCARD', checked_key)
  end
  if type(got) ~= 'table' or not got.err then return nil end
  return 'EMQKEYTYPE ' .. checked_key .. ' holds another type than the ' .. want ..
    ' emqfast keeps there (another program wrote under the queue\'s keys): nothing was ' ..
    'written. Use another queue name, or delete that key if nothing needs it'
end

-- The boot fence: the first write records the keyspace version; a client of
-- another major version is refused instead of corrupting the queue.
-- Returns an error string, or nil when the caller may proceed.
local function emq_fence(meta, version)
  local have = redis.call('HGET', meta, 'version')
  local err = emq_fence_check(have, version)
  if not err and not have then
    redis.call('HSET', meta, 'version', version)
  end
  return err
end

-- Why a caller no longer holds the lease on job `id` (hash `job_key`): EMQGONE when the
-- job's hash is gone while leased (no move deletes an active job's hash: the queue's keys
-- were deleted under it: a server restart without persistence, FLUSHDB, obliterate),
-- naming the vanished fence when `fenced` is false; else EMQLEASE (expired, taken over).
local function emq_lease_lost(job_key, id, meta, fenced)
  if redis.call('EXISTS', job_key) == 1 then
    return 'EMQLEASE lease on ' .. id .. ' is no longer held by this worker'
  end
  if fenced == nil then fenced = redis.call('HEXISTS', meta, 'version') == 1 end
  return 'EMQGONE job ' .. id .. ' vanished while leased: the keys of its queue are gone' ..
    (fenced and '' or ' (its meta hash and version fence vanished too)') ..
    ' -- a server restart without persistence, FLUSHDB or obliterate'
end

-- Wake one blocked worker now (score 0 = "work is ready").
local function emq_wake(marker)
  redis.call('ZADD', marker, '0', '0')
end

-- Wake a blocked worker at `run_at` unless an earlier wake-up is already set.
local function emq_wake_at(marker, run_at)
  redis.call('ZADD', marker, 'LT', run_at, '1')
end

-- The events stream's cap: meta field 'events' (0 = events off; default 10000 entries,
-- trimmed approximately). Read once per script, then passed to emq_event.
local function emq_events_cap_of(field)  -- from the field's value (false: unset)
  local cap = tonumber(field or '10000')
  if not cap or cap <= 0 then return nil end
  return cap
end

local function emq_events_cap(meta)
  return emq_events_cap_of(redis.call('HGET', meta, 'events'))
end

-- Append one event (field pairs after the name) unless events are off (cap nil).
local function emq_event(events, cap, name, ...)
  if cap then
    redis.call('XADD', events, 'MAXLEN', '~', cap, '*', 'event', name, ...)
  end
end

-- Scripts that append one event per job of a batch append them untrimmed (a MAXLEN on
-- every XADD costs about a third of it) and trim once at the end: nobody reads a
-- stream in the middle of a script, so readers still never see it past its cap.
local function emq_event_untrimmed(events, cap, name, ...)
  if cap then
    redis.call('XADD', events, '*', 'event', name, ...)
  end
end

-- A move of many jobs (promote, start, complete) writes one event entry per
-- EMQ_EVENT_BATCH of them instead of one per job: `ids` is a JSON array of the job ids,
-- each field of `cols` (name -> array of texts, parallel to `ids`) a JSON array of their
-- values (or their one value when all are equal) and each field of `shared` (name -> text,
-- not a JSON array) one value for all. Readers (facade/events.py) expand an entry into
-- one event per job, all at the entry's stream id.
-- An XADD costs ~3 us whatever it holds, a third of a promoted job's Redis CPU when written
-- per job. The cap counts entries, so a stream of batched entries holds up to 16x the
-- events of one of single ones; small batches bound that. (enqueue_many keeps one entry
-- per job: a backlog's stream would otherwise outgrow the job hashes' memory budget.)
-- Written untrimmed: the caller trims once (emq_trim_events).
local EMQ_EVENT_BATCH = 16

-- One column of a batched entry: values s..e of `values` (texts) as a JSON array, or, when
-- they are all the same text (a batch's attempts mostly are), that text alone: readers
-- give a field that is not a JSON array to every job of the entry (same events, no JSON
-- to build).
local function emq_event_column(values, s, e)
  local first = values[s]
  local same = type(first) == 'string' and string.sub(first, 1, 1) ~= '['
  for i = s + 1, e do
    if not same then break end
    same = values[i] == first
  end
  if same then return first end
  local col = {}
  for i = s, e do col[#col + 1] = values[i] end
  return cjson.encode(col)
end

local function emq_events_batched(events, cap, name, ids, cols, shared)
  if not cap then return end
  for s = 1, #ids, EMQ_EVENT_BATCH do
    local e = math.min(s + EMQ_EVENT_BATCH - 1, #ids)
    local part = {}
    for i = s, e do part[#part + 1] = ids[i] end
    local args = {'event', name, 'ids', cjson.encode(part)}
    for field, values in pairs(cols or {}) do
      args[#args + 1] = field
      args[#args + 1] = emq_event_column(values, s, e)
    end
    for field, value in pairs(shared or {}) do
      args[#args + 1] = field
      args[#args + 1] = value
    end
    redis.call('XADD', events, '*', unpack(args))
  end
end

-- The trim that goes with emq_event_untrimmed, once per script (approximate, like
-- emq_event's; LIMIT 0 lifts the default effort cap so a large batch is trimmed whole).
local function emq_trim_events(events, cap)
  if cap then
    redis.call('XTRIM', events, 'MAXLEN', '~', cap, 'LIMIT', 0)
  end
end
