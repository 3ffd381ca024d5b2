-- The fence gate for Redis data: run the commands only if the fence is not older than
-- the greatest recorded for the resource, and record it (kept ARGV[2] ms from now).
-- KEYS[1] the record (P{N}:gate)  KEYS[1 + i] the key command i writes
-- ARGV[1] fence  ARGV[2] ms to keep the record  ARGV[3..] per command: how many words
-- follow its key, its name, then those words
-- Reply {1, reply of each command}; {0, the greater fence recorded}: stale, nothing run;
-- {-1, i, error}: command i failed (the ones before it stand, as in any script).
local fence = tonumber(ARGV[1])
local seen = tonumber(redis.call('GET', KEYS[1]))
if seen and seen > fence then
  return {0, string.format('%d', seen)}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local replies, at = {1}, 3
for i = 2, #KEYS do
  local rest = tonumber(ARGV[at])
  local words = {ARGV[at + 1], KEYS[i]}
  for j = 1, rest do
    words[j + 2] = ARGV[at + 1 + j]
  end
  at = at + rest + 2
  local reply = redis.pcall(unpack(words))
  if type(reply) == 'table' and reply.err then
    return {-1, i - 1, reply.err}
  end
  replies[i] = reply
end
return replies
