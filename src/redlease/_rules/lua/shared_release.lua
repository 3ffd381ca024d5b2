-- KEYS as the acquire's; ARGV[1] token  ARGV[2] fair (unused)  ARGV[3] bell key prefix
-- ARGV[4] ms to remember the release (KEYS[1] .. ':released', token -> until when, for
-- a second run after a reply lost with its connection)  ARGV[5] limit  ARGV[6] mode
-- Reply 1: released (and the next waiters served), now or by an earlier run; 0: the
-- hold was not ours (it ran out, or was never granted).
--@include waiters
--@include holds
local holders, fence, queue, fences = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local marks = KEYS[1] .. ':released'
local now = now_us()
held_now(holders, fences, now)
if not drop(holders, fences, ARGV[1]) then
  local mark = redis.call('ZSCORE', marks, ARGV[1])
  if mark and tonumber(mark) > now_ms(now) then return 1 end
  return 0
end
redis.call('ZREMRANGEBYSCORE', marks, '-inf', now_ms(now))
redis.call('ZADD', marks, now_ms(now) + num(ARGV[4]), ARGV[1])
keep_for(marks, num(ARGV[4]), num(ARGV[4]))
hand_on_holds(holders, fences, fence, queue, ARGV[3], now)
return 1
