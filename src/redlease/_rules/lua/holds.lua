-- Shared holds: Semaphore and ReadWriteLock.
--
-- The lock's scripts with a set of holders in place of one, for a semaphore's permits and
-- a read/write lock's leases alike:
-- KEYS[1] holders: a sorted set, token -> when its hold runs out (server ms)
-- KEYS[2..3] fence, queue: as the lock's
-- KEYS[4] fences: token -> its hold's fence (hash); field "@writer" -> the writer's token
-- ARGV: the lock script's, then the caller's limit and its mode: 'r' (shared: a
-- semaphore's permit, a read lease) or 'w' (exclusive: a write lease); each script says
-- where.
-- A shared hold is granted while fewer than limit are held and no writer holds; an
-- exclusive one while nothing is held. Waiters are served strictly in arrival order, as
-- many at once as fit, each with its own limit (carried in its queue entry): so a
-- waiting writer holds back the readers that come after it, and is never starved. Holds
-- past their time are dropped by every script before it counts (their holders died or
-- lost them). A waiter's queue entry (see waiters.lua) is
-- "deadline_us:ttl_ms:limit:mode[:hub]".
--@include fences
--@include waiters

local function now_ms(now) return math.floor(now / 1000) end

local function shared_hub(entry) return (select(5, entry_fields(entry))) end

-- drop the holds that ran out (and their fences)
local function held_now(holders, fences, now)
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now_ms(now))
  for i = 1, #gone, 500 do
    redis.call('HDEL', fences, unpack(gone, i, math.min(i + 499, #gone)))
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', holders, '-inf', now_ms(now)) end
end

local function writer_holds(holders, fences)
  local w = redis.call('HGET', fences, '@writer')
  if not w then return false end
  if redis.call('ZSCORE', holders, w) then return true end
  redis.call('HDEL', fences, '@writer')  -- it ran out
  return false
end

-- whether a hold of mode (under limit) may be granted now, and how many are held
local function fits(holders, fences, limit, mode)
  local count = redis.call('ZCARD', holders)
  if mode == 'w' then return count == 0, count end
  return count < limit and not writer_holds(holders, fences), count
end

-- a hold for w, for ttl ms from now, with the next fence. first: nothing else is held
-- (so no TTL of the holders' keys need be kept: they are set, not read)
local function grant(holders, fences, fence, w, ttl, now, mode, first)
  local ms = num(ttl)
  redis.call('ZADD', holders, now_ms(now) + ms, w)
  local top, taken = take_fences(fence, 1, ttl, 0, false, now)
  redis.call('HSET', fences, w, top)
  if mode == 'w' then redis.call('HSET', fences, '@writer', w) end
  if first then
    redis.call('PEXPIRE', holders, 2 * ms)
    redis.call('PEXPIRE', fences, 2 * ms)
  else
    keep_for(holders, ms, ms)
    keep_for(fences, ms, ms)
  end
  return top, taken
end

-- take w's hold away; whether it had one
local function drop(holders, fences, w)
  if redis.call('ZREM', holders, w) == 0 then return false end
  redis.call('HDEL', fences, w)
  if redis.call('HGET', fences, '@writer') == w then redis.call('HDEL', fences, '@writer') end
  return true
end

-- grant holds to the first live waiters, in order, while the next one fits; a waiter
-- that cannot hear its ring is dropped (its hold undone). The caller, if it is one of
-- them, is not rung: it is here (its hub may not listen just now), and finds its hold.
-- Returns whether the caller was granted one, and the live waiter left first (nil: none).
local function hand_on_holds(holders, fences, fence, queue, bells, now, caller)
  local got = false
  while true do
    local w, entry = live_head(queue, now)
    if not w then return got, nil end
    local _, ttl, limit, mode, hub = entry_fields(entry)
    local ok, count = fits(holders, fences, num(limit), mode)
    if not ok then return got, w end
    redis.call('LPOP', queue)
    local top, taken = grant(holders, fences, fence, w, ttl, now, mode, count == 0)
    if w == caller then
      got = true
    elseif not ring(bells, w, hub, top, taken, now, ttl) then
      drop(holders, fences, w)
    end
  end
end

-- our hold, if we have one: {fence, ms left}
local function ours(holders, fences, token, now)
  local until_ms = redis.call('ZSCORE', holders, token)
  if not until_ms then return nil end
  return {tonumber(redis.call('HGET', fences, token)), tonumber(until_ms) - now_ms(now)}
end
