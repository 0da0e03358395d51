-- partitions.lua: the layout fence of a partitioned queue. The logical queue's meta hash
-- records, once, how many partitions its jobs are spread over; a client opening it with
-- another number (or a queue that holds plain jobs of its own) is refused before any write.
--
-- KEYS[1] meta_key    meta hash       emq:{q}:meta (the logical queue's)
-- ARGV[1] partitions  the number of partitions the caller opens the queue with (1..1024)
-- ARGV[2] version     keyspace version of the caller
-- ARGV[3] mode        'record' (a writer: records the layout when none is) or 'check' (a
--                     reader: writes nothing)
-- Returns: the number of partitions recorded (equal to ARGV[1]), 0 when none is and
--          mode is 'check'
-- Errors:  EMQINPUT partitions not an integer in 1..1024; EMQVERSION keyspace of another
--          major version; EMQPARTITIONS another layout recorded, or the name holds a plain
--          (unpartitioned) queue
--@include common

local meta_key = KEYS[1]
local partitions = ARGV[1]
local version = ARGV[2]
local mode = ARGV[3]

if mode ~= 'record' and mode ~= 'check' then
  return redis.error_reply("EMQINPUT mode must be 'record' or 'check'")
end
local n = tonumber(partitions)
if not n or n % 1 ~= 0 or n < 1 or n > 1024 then
  return redis.error_reply('EMQINPUT partitions must be an integer in 1..1024, got ' ..
    tostring(partitions))
end
local layout = 'partitioned:' .. n .. ':' .. version
local have = redis.call('HGET', meta_key, 'version')
local recorded = have and string.match(have, '^partitioned:(%d+):')
if have and not recorded then
  return redis.error_reply('EMQPARTITIONS queue holds a plain (unpartitioned) queue ' ..
    'of this name: it cannot be opened with partitions=' .. n .. '; drain it and use ' ..
    'another name (see the docs: changing the number of partitions)')
end
if recorded and tonumber(recorded) ~= n then
  return redis.error_reply('EMQPARTITIONS queue was made with partitions=' .. recorded ..
    ', this client opens it with partitions=' .. n .. ': use ' .. recorded ..
    ', or drain and switch (see the docs: changing the number of partitions)')
end
local err = emq_fence_check(recorded and string.match(have, '^partitioned:%d+:(.*)$'), version)
if err then return redis.error_reply(err) end
if have then return n end
if mode == 'check' then return 0 end
redis.call('HSET', meta_key, 'version', layout, 'partitions', n)
return n
