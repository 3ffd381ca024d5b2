-- KEYS[1] lock  ARGV[1] token
-- Reply 1: it was ours on this node and is deleted; 0: not ours (nothing changed).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
