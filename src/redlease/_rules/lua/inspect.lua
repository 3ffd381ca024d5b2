-- Read one lock's, election's, semaphore's or read/write lock's state in one snapshot
-- judged by the server's own clock. Writes nothing: holds past their time and dead
-- waiters, which the other scripts drop as they meet them, are only left out or marked.
-- KEYS[1] lock (a semaphore's or read/write lock's: holders)  KEYS[2] fence
-- KEYS[3] queue  KEYS[4] fences (semaphore, read/write lock only)
-- ARGV[1] 'shared' (KEYS[1] is a sorted set of holds) or 'single' (a lock's key)
-- ARGV[2] the bells' prefix (a waiter's hub listens on it)
-- Reply {server_us, fence counter ('' if none), holders, waiters}. holders: flat, per
-- holder {token, ms left (-1: the key has no TTL), its hold's fence ('' if the server
-- keeps none per hold), 'w' (exclusive) or 'r' (shared)}. waiters: flat, in queue
-- order, per queued token {token, 1 live or 0 dead (past its
-- deadline, or its hub gone: it would not be served; a caller that may not ask whether
-- a hub listens judges by the deadline alone), us from now to its entry's deadline
-- (negative: past)}.
--@include waiters
--@include holds
local now = now_us()
local holders = {}
if ARGV[1] == 'shared' then
  -- the holds held_now keeps: those running out after this millisecond
  local held = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms(now), '+inf', 'WITHSCORES')
  local writer = redis.call('HGET', KEYS[4], '@writer')
  for i = 1, #held, 2 do
    local token = held[i]
    local fence = redis.call('HGET', KEYS[4], token) or ''
    holders[#holders + 1] = token
    holders[#holders + 1] = tonumber(held[i + 1]) - now_ms(now)
    holders[#holders + 1] = fence
    holders[#holders + 1] = token == writer and 'w' or 'r'
  end
else
  local holder = redis.call('GET', KEYS[1])
  if holder then
    holders = {holder, redis.call('PTTL', KEYS[1]), '', 'w'}
  end
end
local waiters = {}
for _, item in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local token, entry = item_of(item)
  if entry then
    waiters[#waiters + 1] = token
    local hub = ARGV[1] == 'shared' and shared_hub(entry) or entry_hub(entry)
    local live = entry_live(entry, now) and (not hub or hub_listens(ARGV[2], hub, true))
    waiters[#waiters + 1] = live and 1 or 0
    waiters[#waiters + 1] = entry_deadline(entry) - now
  end
end
return {now, redis.call('GET', KEYS[2]) or '', holders, waiters}
