-- A waiter gives up: as the lock's leave. KEYS as the acquire's; ARGV[1] token
-- ARGV[2] fair (unused)  ARGV[3] bell key prefix  ARGV[4] '1': keep a hold granted to
-- us meanwhile; '0': give it back  ARGV[5] ms the attempt's mark lasts (holders ..
-- ':mark:' .. token = 'left', as the lock's)  ARGV[6] the token's place (as the lock's leave's)
-- ARGV[7] limit  ARGV[8] mode
-- Reply {fence, pttl, taken}: fence > 0 when a hold was kept; {0, 0, 0} otherwise.
--@include waiters
--@include holds
local holders, fence, queue, fences = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token = ARGV[1]
forget(queue, token, ARGV[6])
redis.call('DEL', ARGV[3] .. token)
local now = now_us()
held_now(holders, fences, now)
local held = ours(holders, fences, token, now)
if held then
  if ARGV[4] == '1' then return {held[1], held[2], 1} end
  drop(holders, fences, token)
end
redis.call('SET', holders .. ':mark:' .. token, 'left', 'PX', ARGV[5])
-- what we held, or our place in the queue (a waiter we held back), may be due to others
hand_on_holds(holders, fences, fence, queue, ARGV[3], now)
return {0, 0, 0}
