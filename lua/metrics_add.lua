-- metrics_add.lua: add a Worker's batched histogram observations to the metrics hash.
-- complete.lua and fail.lua return each run's wait/run ms instead of bucketing them
-- per job; the Worker buckets an ack batch (emqfast/metrics.py) and writes it here in
-- one call, so the per-job scripts stay cheap and the totals stay cluster-wide.
--
-- KEYS[1] metrics_key  metrics hash    emq:{q}:metrics
-- KEYS[2] meta_key     meta hash       emq:{q}:meta
-- ARGV[1] version      keyspace version of the caller
-- ARGV[2..] field, increment pairs: '<wait|run>:le:<bound>' or '<wait|run>:sum', integer >= 0
-- Returns: number of fields incremented
-- Errors:  EMQINPUT odd pair list, a field that is not a histogram field or an increment
--          that is not an integer >= 0; EMQVERSION keyspace of another major version
--@include common

local metrics_key = KEYS[1]
local meta_key = KEYS[2]
local version = ARGV[1]

if (#ARGV - 1) % 2 ~= 0 then
  return redis.error_reply('EMQINPUT metrics_add needs field/increment pairs')
end
-- validate every pair before the first write (the counters are the scripts' alone)
for i = 2, #ARGV, 2 do
  local field, n = ARGV[i], tonumber(ARGV[i + 1])
  local rest = string.match(field, '^wait:(.*)$') or string.match(field, '^run:(.*)$')
  if not rest or not (rest == 'sum' or rest == 'le:+Inf' or string.match(rest, '^le:%d+$')) then
    return redis.error_reply('EMQINPUT not a histogram field: ' .. field)
  end
  if not n or n < 0 or n % 1 ~= 0 then
    return redis.error_reply('EMQINPUT increment must be an integer >= 0')
  end
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', metrics_key, ARGV[i], ARGV[i + 1])
end
return (#ARGV - 1) / 2
