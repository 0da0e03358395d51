-- includes/metrics.lua: the run times a finishing script hands back to its caller.
-- Needs common.lua. Histograms are not written here: the Worker buckets the times of
-- a whole ack batch and adds them with one metrics_add.lua call (emqfast/metrics.py
-- owns the bucket bounds), which keeps per-job Redis CPU on the drain path low.

-- One read of what a finishing script needs from the job hash: the wait (due -> started)
-- and run (started -> now) ms of the run ending now, -1 for a time that cannot be known
-- (never started), and the attempt number for its event. "Due" is the run-at for a
-- delayed or retried job, else its creation, so a requested delay is not counted as
-- queueing. Integers: a Lua number in a reply is truncated to one anyway.
local function emq_run_times(job_key, now)
  local f = redis.call('HMGET', job_key, 'created', 'run_at', 'started', 'attempts')
  local attempt = f[4] or '0'
  local started = tonumber(f[3] or '')
  if not started then return -1, -1, attempt end
  local due = tonumber(f[2] or '') or tonumber(f[1] or '')
  local wait = -1
  if due then wait = math.floor(math.max(started - due, 0)) end
  return wait, math.floor(math.max(now - started, 0)), attempt
end
