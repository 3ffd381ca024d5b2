-- A scheduled job's extend: the lock's, never past the server's ms at which the job's
-- at-most time ends, and never shortening it: a renewal that reaches the server after
-- the run's release kept the name for its at-least time must not cut that short (while
-- the run holds it, its expiry is never later than this extend's).
-- KEYS[1] lock  ARGV[1] token  ARGV[2] ttl ms  ARGV[3] the server's ms of the at-most end
-- Reply: the ms the lease now lasts (> 0); 0: not ours (or its at-most time is over).
--@include clock
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local left = math.min(tonumber(ARGV[2]), tonumber(ARGV[3]) - server_ms())
if left <= 0 then return 0 end
local kept = redis.call('PTTL', KEYS[1])
if kept > left then return kept end
redis.call('PEXPIRE', KEYS[1], left)
return left
