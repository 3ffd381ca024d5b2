-- KEYS[1] lock  KEYS[2] fence  ARGV[1] token  ARGV[2] ttl ms
-- As the lock's extend; the fence counter (the leader's term, which observers read) is
-- kept at least as long as a grant keeps it, so it lasts as long as the leader.
-- Reply 1: the lock is ours and now expires ttl ms from now; 0: not ours.
--@include constants
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local keep = 2 * tonumber(ARGV[2]) + FENCE_MARGIN_MS
if redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], keep) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
