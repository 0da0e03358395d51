-- includes/admit.lua: writing a new job: shared by enqueue.lua and the schedule
-- pump, so a minted occurrence is exactly an ordinary job. Needs common.lua.

-- Admit job `id` (its hash at `job_key`): pending now when run_at <= now, else
-- parked on the delayed set. The caller has validated everything and checked
-- that the job does not exist. Returns 'pending' or 'scheduled'.
local function emq_admit(job_key, pending, delayed, marker, counter,
                         id, payload, enc, opts, priority, run_at, now)
  local seq = redis.call('INCR', counter)
  local ps = priority * 4294967296 + (seq % 4294967296)
  if run_at > now then
    redis.call('HSET', job_key, 'state', 'scheduled', 'payload', payload, 'enc', enc,
      'opts', opts, 'ps', emq_int(ps), 'created', emq_int(now), 'run_at', emq_int(run_at),
      'attempts', '0')
    redis.call('ZADD', delayed, emq_delayed_score(delayed, run_at), id)
    emq_wake_at(marker, run_at)
    return 'scheduled'
  end
  redis.call('HSET', job_key, 'state', 'pending', 'payload', payload, 'enc', enc,
    'opts', opts, 'ps', emq_int(ps), 'created', emq_int(now), 'attempts', '0')
  redis.call('ZADD', pending, ps, id)
  emq_wake(marker)
  return 'pending'
end
