-- includes/schedule.lua: helpers of the schedule scripts. Needs common.lua.

-- Point the wake marker at a schedule's next run. Like emq_wake_at it keeps an
-- earlier wake-up that is still ahead, but it replaces one already in the past:
-- that is a spent "wake now" (any worker that blocks next learns delayed run-ats
-- from its claim reply anyway), and leaving it would hide the next run.
local function emq_wake_for_run(marker, run_at, now)
  local cur = redis.call('ZSCORE', marker, '1')
  if not cur or tonumber(cur) <= now or run_at < tonumber(cur) then
    redis.call('ZADD', marker, run_at, '1')
  end
end
