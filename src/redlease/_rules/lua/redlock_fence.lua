-- KEYS[1] lock  KEYS[2] fence
-- ARGV[1] token  ARGV[2] fencing token chosen by the holder  ARGV[3] ttl ms
-- Reply 1: the lock is ours on this node and its counter is now at least ARGV[2];
-- 0: not ours (nothing written: a raise counts only while we hold the node).
--@include fences

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local wanted = tonumber(ARGV[2])
if (tonumber(redis.call('GET', KEYS[2])) or 0) < wanted then
  -- taken as one fence from a floor just below it: the same expiry rule as every grant
  take_fences(KEYS[2], 1, ARGV[3], wanted - 1, true)
end
return 1
