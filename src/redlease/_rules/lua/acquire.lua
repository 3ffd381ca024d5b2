-- KEYS[1] lock  KEYS[2] fence  KEYS[3] queue
-- ARGV[1] token  ARGV[2] ttl ms  ARGV[3] fair ('1'/'0')
-- ARGV[4] queue-entry lifetime ms ('0': do not queue)  ARGV[5] bell key prefix
-- ARGV[6] fences a grant takes (always 1)
-- ARGV[7] the waiter's hub ('': rung on its bell)
-- ARGV[8] the token's place in the queue, as its last try's reply gave it ('': none,
-- a first try; '?': not known, see waiters.lua)
-- ARGV[9] ms a try of the token may still land after it was sent (the mark of a try
-- that queued it anew after a search lasts that long; see waiters.lua)
-- Reply, in one of three shapes (the cheapest for the server that says what the try did;
-- _rules/flows.py's acquire_reply reads them all):
-- * an integer, a grant on the fast path: the fence taken (the only one), the whole ttl
--   valid, not queued;
-- * a string "pttl:seconds:microseconds:place", nothing granted: held by another, pttl =
--   its ms left (-2: free but promised to a waiter), or the token's attempt was given up;
--   the server's time of the try (TIME's two fields; 0:0 if not read); place: the token's
--   place after this try, for its next one ('': not queued);
-- * {fence, pttl, server_us, taken, place}, any other grant: the highest fence taken, and
--   taken of them; pttl = ms of validity left.
-- A token whose attempt was given up (LEAVE left its mark, lock .. ':mark:' .. token =
-- 'left') is never granted nor queued: an acquire of that attempt that reaches the
-- server after its clean-up (sent on a connection dropped with it in flight) takes
-- nothing.
--@include fences
-- Fast path first, before the other helpers are defined: the token's attempt goes on,
-- never queued, the lock is free and either nobody is queued (so nobody can have been
-- granted or promised it) or it is unfair (a free lock is anyone's). One EXISTS asks
-- for the token's mark, counted twice, and the queue: seen is 0 (none), 1 (queued ones
-- only), 2 or 3 (a mark, and the queue: below, GET says which mark).
local mark = KEYS[1] .. ':mark:' .. ARGV[1]
local seen = redis.call('EXISTS', mark, mark, KEYS[3])
if (seen == 0 or (seen == 1 and ARGV[3] == '0' and ARGV[8] == ''))
    and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local top, taken = take_fences(KEYS[2], ARGV[6], ARGV[2], 0, false)
  if taken == 1 then return top end
  return {top, num(ARGV[2]), 0, taken, ''}
end
--@include waiters
--@include lock

local lock, fence, queue = KEYS[1], KEYS[2], KEYS[3]
local token, fair, place = ARGV[1], ARGV[3], ARGV[8]
-- A mark is 'left' (the attempt was given up: seen stays 2 or more) or 'requeued' (a later
-- try of the attempt queued the token anew after a search, see waiters.lua: a first try
-- landing after it searches too). Rare: only a try that may have landed late finds one.
if seen >= 2 and redis.call('GET', mark) == 'requeued' then
  seen = seen - 2
  if place == '' then place = '?' end
end
-- A first try that may queue (place '': never sent before, as a resend says '?') cannot
-- hold the lock: while others are queued, the lock's PTTL says whether anyone does, and
-- is what its reply needs. (A key without a TTL is none of ours: GET says what it holds,
-- or that it is no string. The first to queue has read the lock with GET: a key of
-- another type there is said before anyone queues behind it.)
local holder, pttl
if place == '' and ARGV[4] ~= '0' and seen == 1 then
  pttl = redis.call('PTTL', lock)
  holder = pttl ~= -2 and (pttl ~= -1 or redis.call('GET', lock))
else
  holder = redis.call('GET', lock)
end
if holder == token then
  -- granted to us while we were away, or a retried call whose first reply was lost
  if fair == '0' then unmark(lock, token) end
  forget(queue, token, place)
  local f, taken = held_fence(fence, ARGV[5] .. token)
  return {f, redis.call('PTTL', lock), 0, taken, ''}
end
if seen >= 2 then return ms_digits(pttl or redis.call('PTTL', lock)) .. ':0:0:' end
local now, time = now_us()
if not holder and fair == '1' then
  local first = live_head(queue, now)
  if first ~= nil and first ~= token then
    -- the free lock belongs to the first waiter that can hear it, not to us, unless
    -- every waiter before us is gone
    hand_on(lock, fence, queue, ARGV[5], fair, now)
    holder, pttl = redis.call('GET', lock), nil
    if holder == token then
      forget(queue, token, place)
      local f, taken = held_fence(fence, ARGV[5] .. token)
      return {f, redis.call('PTTL', lock), now, taken, ''}
    end
  end
end
if not holder then
  redis.call('SET', lock, token, 'PX', ARGV[2])
  if fair == '0' then unmark(lock, token) end
  if forget(queue, token, place) then redis.call('DEL', ARGV[5] .. token) end
  local top, taken = take_fences(fence, ARGV[6], ARGV[2], 0, false, now)
  return {top, num(ARGV[2]), now, taken, ''}
end
if ARGV[4] ~= '0' then
  local life = num(ARGV[4])
  -- a first try queues at the back; a later one keeps its place, and (only an unfair
  -- lock reads it) its since
  local was, at, others, searched = find(queue, token, place)
  local since = now
  if was and fair == '0' then since = entry_since(select(2, item_of(was))) end
  local entry = string.format('%d:%s:%d', now + life * 1000, ARGV[2], since)
  if ARGV[7] ~= '' then entry = entry .. ':' .. ARGV[7] end
  place = token .. '|' .. entry
  put(lock, queue, token, place, at, others, searched, life, ARGV[9])
end
return ms_digits(pttl or redis.call('PTTL', lock)) .. ':' .. time[1] .. ':' .. time[2] .. ':'
  .. place
