-- A waiter gives up (timeout, cancellation, error): take it out of the queue.
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] queue
-- ARGV[1] token  ARGV[2] fair ('1'/'0')  ARGV[3] bell key prefix
-- ARGV[4] '1': keep a lock granted to us meanwhile; '0': release it
-- ARGV[5] ms the attempt's mark lasts (lock .. ':mark:' .. token = 'left'): an acquire of this
-- token that reaches the server after this leave (it was in flight on a connection
-- dropped with it) finds it, and takes nothing
-- ARGV[6] the token's place in the queue, as the acquire's ARGV[8]
-- Reply {fence, pttl, taken}: fence > 0 when a grant was kept (taken of its fences are
-- ours); {0, 0, 0} otherwise, and the attempt is over.
--@include waiters
--@include lock
local lock, fence, queue = KEYS[1], KEYS[2], KEYS[3]
local token, bell = ARGV[1], ARGV[3] .. ARGV[1]
forget(queue, token, ARGV[6])
if ARGV[2] == '0' then unmark(lock, token) end
local holder = redis.call('GET', lock)
if holder == token then
  local f, taken = held_fence(fence, bell)
  if ARGV[4] == '1' then return {f, redis.call('PTTL', lock), taken} end
  redis.call('DEL', lock)
  holder = false
end
redis.call('DEL', bell)
redis.call('SET', lock .. ':mark:' .. token, 'left', 'PX', ARGV[5])
-- a free lock may have been waiting for us (fair) or woken us (not fair): pass it on
if not holder then hand_on(lock, fence, queue, ARGV[3], ARGV[2]) end
return {0, 0, 0}
