-- includes/metrics.lua: per-queue counters and latency histograms kept in the
-- metrics hash, so any process can export a cluster-wide view. Needs common.lua.
-- The bucket bounds (ms) are mirrored by emqfast/metrics.py BUCKETS_MS (a test
-- holds the two in step).
local EMQ_BUCKETS = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
  300000, 1800000}

-- Count one observation of `ms` into histogram `name` (fields '<name>:le:<bound>'
-- per bucket, not cumulative; '<name>:le:+Inf' above the last; '<name>:sum').
local function emq_observe(metrics, name, ms)
  if ms < 0 then ms = 0 end
  local le = '+Inf'
  for _, bound in ipairs(EMQ_BUCKETS) do
    if ms <= bound then
      le = tostring(bound)
      break
    end
  end
  redis.call('HINCRBY', metrics, name .. ':le:' .. le, 1)
  redis.call('HINCRBY', metrics, name .. ':sum', ms)
end

-- Wait (due -> started) and run (started -> now) times of the run ending now, from the
-- job hash. "Due" is the run-at for a delayed or retried job, else its creation, so a
-- requested delay is not counted as queueing.
local function emq_observe_run(metrics, job_key, now)
  local f = redis.call('HMGET', job_key, 'created', 'run_at', 'started')
  local started = tonumber(f[3] or '')
  if not started then return end
  local due = tonumber(f[2] or '') or tonumber(f[1] or '')
  if due then emq_observe(metrics, 'wait', started - due) end
  emq_observe(metrics, 'run', now - started)
end
