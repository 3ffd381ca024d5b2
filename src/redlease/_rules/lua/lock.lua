-- The lock's own: handing a free lock on, and finding the fence of a grant we hold.
--@include constants
--@include fences
--@include waiters

-- the lock is free: fair mode grants it to the first live waiter (no one can barge in
-- between). Unfair mode rings that waiter to compete, staying first in line, unless a
-- waiter rung before has not had its turn yet (the lock's woken mark, for WOKEN ms); a
-- first waiter queued STARVING us ago is granted the lock as in fair mode (see
-- UNFAIR_STARVING). A waiter that cannot hear its ring is dropped (its grant, if any,
-- undone: the fence it took is skipped) and the next one served. The lock may still hold
-- the releasing caller's token: a grant overwrites it. Returns whether the lock was
-- granted (else the caller deletes what it released). now: as for live_head; read (unfair
-- only): the head of the queue, if the caller has read it.
local function hand_on(lock, fence, queue, bells, fair, now, read)
  local pop = fair == '1'
  local woken = not pop and lock .. ':woken'
  while true do
    local w, entry
    w, entry, now = live_head(queue, now, pop, read)
    read = nil
    if not w then return false end
    local _, ttl, since, hub = entry_fields(entry)
    local grant = pop or now - num(since) >= UNFAIR_STARVING_US
    if not grant and not redis.call('SET', woken, w, 'PX', UNFAIR_WOKEN_MS, 'NX') then
      return false
    end
    local granted, taken = 0, 0
    if grant then
      if not pop then redis.call('LPOP', queue) end
      redis.call('SET', lock, w, 'PX', ttl)
      granted, taken = take_fences(fence, 1, ttl, 0, false, now)
    end
    if ring(bells, w, hub, granted, taken, now, ttl) then return grant end
    if grant then
      redis.call('DEL', lock)
    else
      redis.call('LPOP', queue)
      redis.call('DEL', woken)
    end
  end
end

-- an unfair lock's woken mark goes once the waiter it names is served or gone
local function unmark(lock, token)
  local woken = lock .. ':woken'
  if redis.call('GET', woken) == token then redis.call('DEL', woken) end
end

-- the highest fence of a grant we hold, and how many it took: from our bell if it was
-- handed to us, else the counter (and 1: only the highest is surely ours)
local function held_fence(fence, bell)
  local rung = redis.call('LPOP', bell)
  redis.call('DEL', bell)
  if rung then
    local f, taken = string.match(rung, '^(%d+):%d+:(%d+)$')
    if f and f ~= '0' then return tonumber(f), tonumber(taken) end
  end
  return tonumber(redis.call('GET', fence)), 1
end
