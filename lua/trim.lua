-- trim.lua: retention: delete the oldest jobs of a completed, failed, cancelled or expired set,
-- together with their hashes, while the set holds more than `keep` jobs or the job
-- finished more than `max_age` ms ago (server clock). The caller lists the set's head
-- (ZRANGE 0 n-1, oldest first); each id is re-checked here, so a stale list or a
-- concurrent trimmer never deletes a job the retention rule keeps. At most 4000 ids
-- per call (bounded work); the caller loops while the reply says "more".
-- A deleted job that still holds a dedupe key (its hash's `ddk`) gives it up:
-- the dedupe hash entry goes with the job's record, so that hash stays as bounded as the
-- kept records. Free (one HLEN per call) while the dedupe hash is empty.
--
-- KEYS[1] finished_key     finished zset   emq:{q}:completed, emq:{q}:failed, emq:{q}:cancelled or
--         emq:{q}:expired
-- KEYS[2] meta_key         meta hash       emq:{q}:meta
-- KEYS[3] dedupe_hash_key  dedupe hash     emq:{q}:dedupe
-- KEYS[4..] job hashes   emq:{q}:job:<id>, one per ARGV[4..] id, same order
-- ARGV[1] version          keyspace version of the caller
-- ARGV[2] keep_arg         keep: integer >= 0, the newest jobs never deleted by count
-- ARGV[3] max_age_arg      max_age ms: integer >= 0, or -1 for no age rule
-- ARGV[4..] job ids, oldest first (at most 4000)
-- Returns: {deleted, more}: more = 1 when every listed job was past the rule (the next
--          head may be too), 0 when the script reached a job the rule keeps
-- Errors:  EMQINPUT mismatched KEYS/ARGV counts, bad keep / max_age or more than 4000 ids;
--          EMQVERSION keyspace of another major version
--@include common

local finished_key = KEYS[1]
local meta_key = KEYS[2]
local dedupe_hash_key = KEYS[3]
local version = ARGV[1]
local keep_arg = ARGV[2]
local max_age_arg = ARGV[3]

local keep, max_age = tonumber(keep_arg), tonumber(max_age_arg)
if #ARGV - 3 > EMQ_MAX_BATCH then
  return redis.error_reply('EMQINPUT trim takes at most ' .. EMQ_MAX_BATCH .. ' ids per call')
end
if #ARGV < 3 or #ARGV - 3 ~= #KEYS - 3 then
  return redis.error_reply('EMQINPUT trim needs keep, max_age, the dedupe hash and one job ' ..
    'key per id')
end
if not keep or keep < 0 or keep % 1 ~= 0 or not max_age or max_age < -1 or max_age % 1 ~= 0 then
  return redis.error_reply('EMQINPUT trim needs an integer keep >= 0 and max_age >= -1')
end
local err = emq_fence(meta_key, version)
if err then return redis.error_reply(err) end
local cutoff = nil
if max_age >= 0 then cutoff = emq_now() - max_age end
local card = redis.call('ZCARD', finished_key)
local n = 0
-- the dedupe hash is not empty: deleted jobs may hold keys
local keyed = redis.call('HLEN', dedupe_hash_key) > 0
-- A deleted job's dedupe key goes with it, unless a newer job holds it now.
local function give_up_key(dedupe, key, id)
  local ddk = redis.call('HGET', key, 'ddk')
  if ddk and redis.call('HGET', dedupe, ddk) == id then redis.call('HDEL', dedupe, ddk) end
end
for i = 4, #ARGV do
  -- only jobs still in the finished set: a retried or concurrently trimmed job has left it
  local score = redis.call('ZSCORE', finished_key, ARGV[i])
  if score then
    if card <= keep and not (cutoff and tonumber(score) <= cutoff) then
      return {n, 0}  -- the rule keeps this job, and every newer one
    end
    redis.call('ZREM', finished_key, ARGV[i])
    if keyed then give_up_key(dedupe_hash_key, KEYS[i], ARGV[i]) end
    redis.call('DEL', KEYS[i])
    card = card - 1
    n = n + 1
  end
end
return {n, 1}
