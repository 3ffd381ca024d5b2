-- KEYS[1] lock  KEYS[2] fence
-- ARGV[1] token  ARGV[2] ttl ms  ARGV[3] the highest token this client handed out (0: none)
-- Reply counter (an integer, > 0; the shape cheapest for the server): the lock is ours on
-- this node for ttl ms (taken now, or taken by an earlier attempt of the same acquisition
-- whose reply was lost: set afresh), and the node's fence counter, advanced by one in the
-- same step (and raised past ARGV[3] if it lags: a node that restarted empty catches up
-- even if this reply goes unread), is counter. Reply {0, 0, pttl}: held by another; pttl
-- = its ms left (-1 no TTL, -2 gone).
--@include fences

local function count()
  return (take_fences(KEYS[2], 1, ARGV[2], tonumber(ARGV[3]), true))
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return count()
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return count()
end
return {0, 0, redis.call('PTTL', KEYS[1])}
