-- KEYS[1] holders  KEYS[2] fences  ARGV[1] token  ARGV[2] ttl ms
-- Reply 1: the hold is ours and now runs out ttl ms from now; 0: not ours (ran out).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not until_ms or until_ms <= now_ms then return 0 end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now_ms + ttl, ARGV[1])
for _, key in ipairs(KEYS) do
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end
return 1
