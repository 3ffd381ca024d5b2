-- KEYS[1] lock  KEYS[2] fence  KEYS[3] queue
-- ARGV[1] token  ARGV[2] fair ('1'/'0')  ARGV[3] bell key prefix
-- ARGV[4] ms to keep the mark of the last release (lock .. ':released' = its token): a
-- second run, after a reply lost with its connection, finds it (one key per lock, not
-- per release: releases of one lock follow one another)
-- Reply 1: released (and the next waiter served), now or by an earlier run of this
-- release; 0: the lock was not ours.
local mark = KEYS[1] .. ':released'
-- (unfair: the woken mark read with it)
local holder, woken_one
if ARGV[2] == '0' then
  local got = redis.call('MGET', KEYS[1], KEYS[1] .. ':woken')
  holder, woken_one = got[1], got[2]
else
  holder = redis.call('GET', KEYS[1])
end
if holder ~= ARGV[1] then
  -- (MGET reads a key of another type as missing: GET raises WRONGTYPE for it, as the
  -- fair release does)
  if ARGV[2] == '0' then redis.call('GET', KEYS[1]) end
  if redis.call('GET', mark) == ARGV[1] then return 1 end
  return 0
end
redis.call('SET', mark, ARGV[1], 'PX', ARGV[4])
-- unfair: a waiter woken to compete has not had its turn yet while it is first in line
-- (where it stays until it takes its turn); nobody else is woken. A mark whose waiter is
-- gone is void. With nobody queued, there is nobody to wake. (Fair: hand_on's LPOP finds
-- an empty queue.) The head read here is handed on with the lock: not read twice.
local head
if ARGV[2] == '0' then
  head = redis.call('LINDEX', KEYS[3], 0)
  if woken_one then
    if head and string.sub(head, 1, #woken_one + 1) == woken_one .. '|' then
      redis.call('DEL', KEYS[1])
      return 1
    end
    redis.call('DEL', KEYS[1] .. ':woken')
  end
  if not head then
    redis.call('DEL', KEYS[1])
    return 1
  end
end
--@include fences
--@include waiters
--@include lock

-- the lock still holds our token: hand it on, or delete it
if not hand_on(KEYS[1], KEYS[2], KEYS[3], ARGV[3], ARGV[2], nil, head) then
  redis.call('DEL', KEYS[1])
end
return 1
