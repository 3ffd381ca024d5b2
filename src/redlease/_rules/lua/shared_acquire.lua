-- KEYS[1..3] and ARGV[1..9] as the lock's acquire (ARGV[3], fair, is always '1';
-- ARGV[6], the fences a grant takes, always '1'); KEYS[4] fences (see holds.lua)
-- ARGV[10] limit  ARGV[11] mode ('r' or 'w')  ARGV[12] (optional; a read/write lock's)
-- the token of the caller's own lease of the other mode: a read under the caller's write
-- lease (a downgrade) is granted at once, and so is a write over the caller's read lease
-- if that is the only hold (an upgrade).
-- Reply in the lock's shapes (see acquire.lua): an integer, a grant of one fence for the
-- whole ttl; a string "pttl:seconds:microseconds:place", nothing granted, pttl the ms
-- left of the hold that runs out first; {fence, pttl, server_us, taken, place}, any
-- other grant.
--@include waiters
--@include holds
local holders, fence, queue, fences = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl, bell, place = ARGV[1], ARGV[2], ARGV[5] .. ARGV[1], ARGV[8]
local limit, mode = num(ARGV[10]), ARGV[11]
local now, time = now_us()
held_now(holders, fences, now)
local held = ours(holders, fences, token, now)
if not held then
  -- (the token's mark: as the lock's acquire)
  local mark = redis.call('GET', holders .. ':mark:' .. token)
  if mark == 'left' then
    return '-2:' .. time[1] .. ':' .. time[2] .. ':'  -- given up: as the lock's acquire
  end
  if mark and place == '' then place = '?' end
end
local server_us = 0  -- (a grant found: it was made before this call)
local mine = ARGV[12]
if not held and mine and mine ~= '' and redis.call('ZSCORE', holders, mine) then
  local writer = writer_holds(holders, fences) and redis.call('HGET', fences, '@writer')
  if (mode == 'r' and writer == mine)
      or (mode == 'w' and not writer and redis.call('ZCARD', holders) == 1) then
    forget(queue, token, place)
    redis.call('DEL', bell)
    local top, taken = grant(holders, fences, fence, token, ttl, now, mode)
    return {top, num(ttl), now, taken, ''}
  end
end
local first  -- the first live waiter after those served (nil: none)
if not held then
  -- the waiters before us first, in order, as many as fit
  local got
  got, first = hand_on_holds(holders, fences, fence, queue, ARGV[5], now, token)
  if got then held, server_us = ours(holders, fences, token, now), now end
end
if held then
  -- granted to us while we were away or just now, or a retried call whose reply was lost
  forget(queue, token, place)
  redis.call('DEL', bell)
  return {held[1], held[2], server_us, 1, ''}
end
local ok, count = false, 1
if not first or first == token then ok, count = fits(holders, fences, limit, mode) end
if ok then
  -- (a bell is only ever rung for a queued waiter)
  if forget(queue, token, place) then redis.call('DEL', bell) end
  local top, taken = grant(holders, fences, fence, token, ttl, now, mode, count == 0)
  if taken == 1 then return top end
  return {top, num(ttl), now, taken, ''}
end
if ARGV[4] ~= '0' then
  local life = num(ARGV[4])
  local entry = string.format('%d:%s:%d:%s', now + life * 1000, ttl, limit, mode)
  if ARGV[7] ~= '' then entry = entry .. ':' .. ARGV[7] end
  local _, at, others, searched = find(queue, token, place)
  place = token .. '|' .. entry
  put(holders, queue, token, place, at, others, searched, life, ARGV[9])
end
local soonest = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
local left = soonest[2] and math.max(0, tonumber(soonest[2]) - now_ms(now)) or -2
return ms_digits(left) .. ':' .. time[1] .. ':' .. time[2] .. ':' .. place
