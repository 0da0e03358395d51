-- includes/deps.lua: helpers of the dependency scripts (dep_enqueue, dep_link,
-- dep_resolve). Needs common.lua. No keys are built here.

-- The most dependencies one job may have (emqfast/facade/deps.py refuses more first).
local EMQ_MAX_DEPS = 1000

-- The states a job ends in for good: a dependency in one of them is resolved.
local EMQ_ENDED = {completed = true, failed = true, cancelled = true, expired = true}

-- Before the first write: an error reply text when the user's ACL denies one of `checks`
-- ({command, key, up to three more arguments} each, a fixed small list), else nil.
-- Redis < 7 has no redis.acl_check_cmd: nil there (NOPERM then comes at the command).
local function emq_deps_denied(checks)
  local check = redis.acl_check_cmd
  if not check then return nil end
  for _, c in ipairs(checks) do
    if not check(unpack(c)) then  -- (a literal list of at most six: no stack risk)
      return 'NOPERM this user may not run ' .. c[1] .. ' on ' .. c[2] .. ': nothing was written'
    end
  end
  return nil
end
