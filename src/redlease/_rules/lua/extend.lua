-- KEYS[1] lock  ARGV[1] token  ARGV[2] ttl ms
-- Reply 1: the lock is ours and now expires ttl ms from now; 0: not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
