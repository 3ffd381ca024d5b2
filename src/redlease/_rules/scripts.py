"""The Lua scripts: the only code that touches lock keys. Each states its KEYS, ARGV and reply.

Scripts are data: they are sent as EVALSHA and, on NOSCRIPT (a restarted server, a
SCRIPT FLUSH, a replica promoted), as EVAL, which also caches them again. Nothing is
remembered per client or per class, so any client works with any lock.

Shared by the lock scripts (KEYS[1..4] = lock, fence, queue, waiters; see _rules/keys.py):
  * a waiter entry is "deadline_us:ttl_ms:since_us[:hub]" in the waiters hash, in
    arrival order in queue (since: when it first queued, kept across its tries by an
    unfair lock, the only one that reads it); an entry
    past its deadline belongs to a waiter that gave up or died and is skipped;
  * a waiter is rung with "fence:server_us:taken": a fence > 0 means the lock was granted
    to that waiter at server time server_us, with taken fences; fence 0 is a plain
    wake-up. A waiter with a hub (its process's shared wait connection, see
    _sync/hub.py) is rung by a PUBLISH (SPUBLISH for a hub on a Cluster node, whose id
    starts with "s") of "token:fence:server_us:taken" on its hub's channel (bell prefix
    .. "@" .. hub), made only if the hub listens on that server (PUBSUB NUMSUB): one
    that does not tells that the waiter's process, or its connection, is gone (or
    listens on another server, which must not hear of a grant): the waiter is dropped
    and the next one served, at once.
    A waiter without a hub has a doorbell list (bell prefix .. token), pushed;
  * a grant takes a fence from the name's counter (take_fences below), greater than
    every one before. (take_fences can take several at once, and replies and rings
    carry how many were taken; every grant asks for one.)
The bell keys are built inside the scripts from a prefix that carries the lock's hash
tag, so they are in the same slot as KEYS[1] (Cluster runs them on the right node).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from .._base.timing import UNFAIR_STARVING, UNFAIR_WOKEN
from .keys import FENCE_LEAD_US, FENCE_LIMIT, FENCE_MARGIN_MS


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    # Why running it again, after a reply lost with its connection, is harmless (the
    # driver then may); empty: it must not be sent twice.
    retry: str = ""
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


# Defined first in every script that grants: the acquire's fast path needs it.
_FENCES = (
    """
-- Take up to n fences from the counter F for a lease of ttl ms; return the highest and
-- how many were taken. Fences follow the server's clock, in microseconds: a grant takes
-- them above both the counter and the clock (or, dense, above the counter alone, which
-- starts at the clock: a Redlock's nodes then stay in step), and above floor. A counter
-- never runs more than LEAD us ahead of the clock (a grant that would take it further
-- takes fewer fences, at least one) and expires only once the clock has passed it, so
-- one lost with the server's data, expired, or (not dense) left behind on a replica
-- promoted in a failover, still leads to greater fences. See docs/design.md, "Fences".
-- now: the server's time in us if the caller has read it in this run (else read here).
local function take_fences(f, n, ttl, floor, dense, now)
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local last = tonumber(redis.call('GET', f))
  local base = math.max(dense and last or math.max(last or 0, now), floor)
  local taken = math.min(tonumber(n), math.max(1, now + @LEAD@ - base))
  local top = base + taken
  if top >= @LIMIT@ then
    error('redlease: the fence counter ' .. f .. ' would pass 2^53 (is the server clock right?)')
  end
  local keep = 2 * tonumber(ttl) + @MARGIN@ + math.max(0, math.ceil((top - now) / 1000))
  redis.call('SET', f, string.format('%d', top), 'PX', keep)
  return top, taken
end
""".replace("@LEAD@", str(FENCE_LEAD_US))
    .replace("@LIMIT@", str(FENCE_LIMIT))
    .replace("@MARGIN@", str(FENCE_MARGIN_MS))
)

_HELPERS = """
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- every key we write keeps a TTL: extend KEY to at least MS milliseconds; by HEADROOM
-- more when it must be extended, so that callers asking for about the same time one
-- after another (a queue's waiters) read its TTL without setting it each time
local function keep_for(key, ms, headroom)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms + (headroom or 0)) end
end

local function entry_deadline(entry) return tonumber(string.match(entry, '^(%d+)')) end
local function entry_ttl(entry) return string.match(entry, '^%d+:(%d+)') end

local function entry_since(entry) return tonumber(string.match(entry, '^%d+:%d+:(%d+)')) end
local function entry_hub(entry) return string.match(entry, '^%d+:%d+:%d+:(s?%x+)$') end

-- whether a waiter's entry is still within its deadline at server time NOW (us): the one
-- rule for which waiters count (live_head below, and INSPECT's report)
local function entry_live(entry, now) return entry_deadline(entry) >= now end

-- the first waiter still within its deadline (dead ones are dropped), its entry, and the
-- server time NOW (us; read here if nil and there is a waiter to judge); nil if none.
-- With POP the live one found is taken out of the queue too (its hash entry stays).
local function live_head(queue, waiters, now, pop)
  while true do
    local w
    if pop then w = redis.call('LPOP', queue) else w = redis.call('LINDEX', queue, 0) end
    if not w then return nil, nil, now end
    now = now or now_us()
    local entry = redis.call('HGET', waiters, w)
    if entry and entry_live(entry, now) then return w, entry, now end
    if not pop then redis.call('LPOP', queue) end
    redis.call('HDEL', waiters, w)
  end
end

-- take token out of the queue; whether it was queued
local function forget(queue, waiters, token)
  if redis.call('HDEL', waiters, token) == 0 then return false end
  redis.call('LREM', queue, 1, token)
  return true
end

-- whether a waiter's hub listens for its rings here (not: its process is gone, or its
-- connection dropped), and the channel: a hub whose id starts with "s" listens on a
-- Cluster node, through sharded pub/sub (then SHARDED is true). The one rule of whether
-- a waiter with a hub can be served (ring below, and INSPECT's report). LENIENT (a
-- report): a caller not allowed to ask (ACL) is told it listens, not refused.
local function hub_listens(bells, hub, lenient)
  local channel = bells .. '@' .. hub
  local sharded = string.sub(hub, 1, 1) == 's'
  local heard  -- (each call written out: the ACL rule is read from the calls' text)
  if lenient then
    heard = redis.pcall('PUBSUB', sharded and 'SHARDNUMSUB' or 'NUMSUB', channel)
    if heard.err then return true, channel, sharded end
  else
    heard = redis.call('PUBSUB', sharded and 'SHARDNUMSUB' or 'NUMSUB', channel)
  end
  return heard[2] ~= 0, channel, sharded
end

-- false when the waiter cannot hear it (its hub does not listen here: its process is
-- gone). Nothing is published then: a copy would still reach a hub that listens on a
-- replica (replication carries PUBLISH), which must never hear of a grant undone.
local function ring(bells, w, hub, granted, taken, now, ttl)
  if hub then
    local heard, channel, sharded = hub_listens(bells, hub)
    if not heard then return false end
    local message = string.format('%s:%d:%d:%d', w, granted, now, taken)
    redis.call(sharded and 'SPUBLISH' or 'PUBLISH', channel, message)
    return true
  end
  local bell = bells .. w
  redis.call('LPUSH', bell, string.format('%d:%d:%d', granted, now, taken))
  redis.call('PEXPIRE', bell, ttl)
  return true
end

"""

# The lock's own: handing a free lock on, and finding the fence of a grant we hold.
_LOCK_HELPERS = (
    """
-- the lock is free: fair mode grants it to the first live waiter (no one can barge in
-- between). Unfair mode rings that waiter to compete, staying first in line, unless a
-- waiter rung before has not had its turn yet (the lock's woken mark, for WOKEN ms); a
-- first waiter queued STARVING us ago is granted the lock as in fair mode (see
-- UNFAIR_STARVING). A waiter that cannot hear its ring is dropped (its grant, if any,
-- undone: the fence it took is skipped) and the next one served. The lock may still hold
-- the releasing caller's token: a grant overwrites it. Returns whether the lock was
-- granted (else the caller deletes what it released). now: as for live_head.
local function hand_on(lock, fence, queue, waiters, bells, fair, now)
  local woken = lock .. ':woken'
  local pop = fair == '1'
  while true do
    local w, entry
    w, entry, now = live_head(queue, waiters, now, pop)
    if not w then return false end
    local ttl = entry_ttl(entry)
    local grant = pop or now - entry_since(entry) >= @STARVING@
    if not grant and not redis.call('SET', woken, w, 'PX', @WOKEN@, 'NX') then return false end
    local granted, taken = 0, 0
    if grant then
      if not pop then redis.call('LPOP', queue) end
      redis.call('HDEL', waiters, w)
      redis.call('SET', lock, w, 'PX', ttl)
      granted, taken = take_fences(fence, 1, ttl, 0, false, now)
    end
    if ring(bells, w, entry_hub(entry), granted, taken, now, ttl) then return grant end
    if grant then
      redis.call('DEL', lock)
    else
      redis.call('LPOP', queue)
      redis.call('HDEL', waiters, w)
      redis.call('DEL', woken)
    end
  end
end

-- an unfair lock's woken mark goes once the waiter it names is served or gone
local function unmark(lock, token)
  local woken = lock .. ':woken'
  if redis.call('GET', woken) == token then redis.call('DEL', woken) end
end
""".replace("@STARVING@", str(round(UNFAIR_STARVING * 1e6))).replace(
        "@WOKEN@", str(round(UNFAIR_WOKEN * 1000))
    )
    + """
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
"""
)

ACQUIRE = Script(
    "acquire",
    """
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] queue  KEYS[4] waiters
-- ARGV[1] token  ARGV[2] ttl ms  ARGV[3] fair ('1'/'0')
-- ARGV[4] queue-entry lifetime ms ('0': do not queue)  ARGV[5] bell key prefix
-- ARGV[6] fences a grant takes (always 1)
-- ARGV[7] the waiter's hub ('': rung on its bell)
-- Reply {fence, pttl, server_us, taken}. fence > 0: acquired, the highest fence taken,
-- and taken of them; pttl = ms of validity left. fence = 0: held by another, pttl = its
-- ms left (-2: free but promised to a waiter), or the token's attempt was given up.
-- A token whose attempt was given up (LEAVE left its mark, lock .. ':left:' .. token) is
-- never granted nor queued: an acquire of that attempt that reaches the server after its
-- clean-up (sent on a connection dropped with it in flight) takes nothing.
"""
    + _FENCES
    + """
-- Fast path first, before the other helpers are defined: the token's attempt goes on,
-- the lock is free and either nobody is queued (so nobody can have been granted or
-- promised it) or it is unfair (a free lock is anyone's; a queued caller that takes it
-- leaves the queue, and its woken mark goes). (One EXISTS asks for the mark and, fair,
-- the queue.)
local given_up = KEYS[1] .. ':left:' .. ARGV[1]
if redis.call('EXISTS', given_up, ARGV[3] == '0' and given_up or KEYS[3]) == 0
    and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- (a woken mark names a queued waiter only: the caller's, if it was queued)
  if ARGV[3] == '0' and redis.call('HDEL', KEYS[4], ARGV[1]) == 1 then
    redis.call('LREM', KEYS[3], 1, ARGV[1])
    redis.call('DEL', ARGV[5] .. ARGV[1])
    if redis.call('GET', KEYS[1] .. ':woken') == ARGV[1] then
      redis.call('DEL', KEYS[1] .. ':woken')
    end
  end
  local top, taken = take_fences(KEYS[2], ARGV[6], ARGV[2], 0, false)
  return {top, tonumber(ARGV[2]), 0, taken}
end
"""
    + _HELPERS
    + _LOCK_HELPERS
    + """
local lock, fence, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, fair, bell = ARGV[1], ARGV[3], ARGV[5] .. ARGV[1]
local holder = redis.call('GET', lock)
if holder == token then
  -- granted to us while we were away, or a retried call whose first reply was lost
  if fair == '0' then unmark(lock, token) end
  forget(queue, waiters, token)
  local f, taken = held_fence(fence, bell)
  return {f, redis.call('PTTL', lock), 0, taken}
end
if redis.call('EXISTS', given_up) == 1 then return {0, redis.call('PTTL', lock), 0, 0} end
local now = now_us()
if not holder and fair == '1' then
  local first = live_head(queue, waiters, now)
  if first ~= nil and first ~= token then
    -- the free lock belongs to the first waiter that can hear it, not to us, unless
    -- every waiter before us is gone
    hand_on(lock, fence, queue, waiters, ARGV[5], fair, now)
    holder = redis.call('GET', lock)
    if holder == token then
      forget(queue, waiters, token)
      local f, taken = held_fence(fence, bell)
      return {f, redis.call('PTTL', lock), now, taken}
    end
  end
end
if not holder then
  redis.call('SET', lock, token, 'PX', ARGV[2])
  if fair == '0' then unmark(lock, token) end
  forget(queue, waiters, token)
  redis.call('DEL', bell)
  local top, taken = take_fences(fence, ARGV[6], ARGV[2], 0, false, now)
  return {top, tonumber(ARGV[2]), now, taken}
end
if ARGV[4] ~= '0' then
  local life = tonumber(ARGV[4])
  -- a first try queues at the back; a later one keeps its place, and (only an unfair
  -- lock reads it) its since
  local since = now
  if fair == '0' then
    local was = redis.call('HGET', waiters, token)
    if was then since = entry_since(was) end
  end
  local entry = string.format('%d:%s:%d', now + life * 1000, ARGV[2], since)
  if ARGV[7] ~= '' then entry = entry .. ':' .. ARGV[7] end
  local created = false
  if redis.call('HSET', waiters, token, entry) == 1 then
    created = redis.call('RPUSH', queue, token) == 1
  end
  -- the queue and the waiters hash get their TTLs together (so one PTTL reads both),
  -- at least every live entry's; extended with headroom, so the waiters that follow
  -- mostly just read it
  local left = redis.call('PTTL', waiters)
  if left < life then
    redis.call('PEXPIRE', waiters, 2 * life)
    redis.call('PEXPIRE', queue, 2 * life)
  elseif created then
    redis.call('PEXPIRE', queue, left)
  end
end
return {0, redis.call('PTTL', lock), now, 0}
""",
    retry="the same token again finds its own grant and reports it, or queues it once",
)

RELEASE = Script(
    "release",
    """
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] queue  KEYS[4] waiters
-- ARGV[1] token  ARGV[2] fair ('1'/'0')  ARGV[3] bell key prefix
-- ARGV[4] ms to keep the mark of the last release (lock .. ':released' = its token): a
-- second run, after a reply lost with its connection, finds it (one key per lock, not
-- per release: releases of one lock follow one another)
-- Reply 1: released (and the next waiter served), now or by an earlier run of this
-- release; 0: the lock was not ours.
local mark = KEYS[1] .. ':released'
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  if redis.call('GET', mark) == ARGV[1] then return 1 end
  return 0
end
redis.call('SET', mark, ARGV[1], 'PX', ARGV[4])
-- unfair: a waiter woken to compete has not had its turn yet (and is still queued);
-- nobody else is woken. A mark whose waiter is gone is void. (Fair: hand_on's LPOP
-- finds an empty queue.)
if ARGV[2] == '0' then
  if redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('DEL', KEYS[1])
    return 1
  end
  local woken = redis.call('GET', KEYS[1] .. ':woken')
  if woken then
    if redis.call('HGET', KEYS[4], woken) then
      redis.call('DEL', KEYS[1])
      return 1
    end
    redis.call('DEL', KEYS[1] .. ':woken')
  end
end
"""
    + _FENCES
    + _HELPERS
    + _LOCK_HELPERS
    + """
-- the lock still holds our token: hand it on, or delete it
if not hand_on(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[2]) then
  redis.call('DEL', KEYS[1])
end
return 1
""",
    retry="a second run finds the mark the first one left and reports the release",
)

EXTEND = Script(
    "extend",
    """
-- KEYS[1] lock  ARGV[1] token  ARGV[2] ttl ms
-- Reply 1: the lock is ours and now expires ttl ms from now; 0: not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
""",
    retry="setting the same expiry twice is setting it once",
)

LEAVE = Script(
    "leave",
    _FENCES
    + _HELPERS
    + _LOCK_HELPERS
    + """
-- A waiter gives up (timeout, cancellation, error): take it out of the queue.
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] queue  KEYS[4] waiters
-- ARGV[1] token  ARGV[2] fair ('1'/'0')  ARGV[3] bell key prefix
-- ARGV[4] '1': keep a lock granted to us meanwhile; '0': release it
-- ARGV[5] ms the attempt's mark lasts (lock .. ':left:' .. token): an acquire of this
-- token that reaches the server after this leave (it was in flight on a connection
-- dropped with it) finds it, and takes nothing
-- Reply {fence, pttl, taken}: fence > 0 when a grant was kept (taken of its fences are
-- ours); {0, 0, 0} otherwise, and the attempt is over.
local lock, fence, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, bell = ARGV[1], ARGV[3] .. ARGV[1]
forget(queue, waiters, token)
if ARGV[2] == '0' then unmark(lock, token) end
local holder = redis.call('GET', lock)
if holder == token then
  local f, taken = held_fence(fence, bell)
  if ARGV[4] == '1' then return {f, redis.call('PTTL', lock), taken} end
  redis.call('DEL', lock)
  holder = false
end
redis.call('DEL', bell)
redis.call('SET', lock .. ':left:' .. token, '1', 'PX', ARGV[5])
-- a free lock may have been waiting for us (fair) or woken us (not fair): pass it on
if not holder then hand_on(lock, fence, queue, waiters, ARGV[3], ARGV[2]) end
return {0, 0, 0}
""",
    retry="a second run finds the entry gone and the grant kept, or already released",
)

ALL = (ACQUIRE, RELEASE, EXTEND, LEAVE)

MULTI_ACQUIRE = Script(
    "multi_acquire",
    _FENCES
    + """
-- Take several locks at once, all or none: a MultiLock's try when its names share a
-- server (and, on a Cluster, a slot). KEYS: each lock's key, fence counter and queue, in
-- turn  ARGV[1] token  ARGV[2] ttl ms
-- Reply {fence of each}: all taken, with one token (a lock held with it already, by an
-- earlier run whose reply was lost, is ours: its fence is its counter's); {}: one of
-- them is held by another, or has waiters (who come first), so none is taken; or the
-- try was given up (its clean-up, a LEAVE of each name in turn, marked the first).
local n = #KEYS / 3
if redis.call('EXISTS', KEYS[1] .. ':left:' .. ARGV[1]) == 1 then return {} end
for i = 0, n - 1 do
  local holder = redis.call('GET', KEYS[3 * i + 1])
  if holder and holder ~= ARGV[1] then return {} end
  if not holder and redis.call('EXISTS', KEYS[3 * i + 3]) == 1 then return {} end
end
local fences = {}
for i = 0, n - 1 do
  if redis.call('SET', KEYS[3 * i + 1], ARGV[1], 'PX', ARGV[2], 'GET') then
    fences[i + 1] = tonumber(redis.call('GET', KEYS[3 * i + 2]))
  else
    fences[i + 1] = (take_fences(KEYS[3 * i + 2], 1, ARGV[2], 0, false))
  end
end
return fences
""",
    retry="a second run finds the locks held with its token: ours, with their fences",
)


# -- Shared holds: Semaphore and ReadWriteLock ------------------------------------------
#
# The lock's scripts with a set of holders in place of one, for a semaphore's permits and
# a read/write lock's leases alike:
# KEYS[1] holders: a sorted set, token -> when its hold runs out (server ms)
# KEYS[2..4] fence, queue, waiters: as the lock's
# KEYS[5] fences: token -> its hold's fence (hash); field "@writer" -> the writer's token
# ARGV: the lock script's, then ARGV[-2] the caller's limit and ARGV[-1] its mode: 'r'
# (shared: a semaphore's permit, a read lease) or 'w' (exclusive: a write lease).
# A shared hold is granted while fewer than limit are held and no writer holds; an
# exclusive one while nothing is held. Waiters are served strictly in arrival order, as
# many at once as fit, each with its own limit (carried in its queue entry): so a
# waiting writer holds back the readers that come after it, and is never starved. Holds
# past their time are dropped by every script before it counts (their holders died or
# lost them). A queue entry is "deadline_us:ttl_ms:limit:mode[:hub]"...

_SHARED_HELPERS = """
local function now_ms(now) return math.floor(now / 1000) end

local function entry_limit(entry) return tonumber(string.match(entry, '^%d+:%d+:(%d+)')) end
local function entry_mode(entry) return string.match(entry, '^%d+:%d+:%d+:(%a)') end
local function shared_hub(entry) return string.match(entry, '^%d+:%d+:%d+:%a:(s?%x+)$') end

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
  local ms = tonumber(ttl)
  redis.call('ZADD', holders, now_ms(now) + ms, w)
  local top, taken = take_fences(fence, 1, ttl, 0, false, now)
  redis.call('HSET', fences, w, string.format('%d', top))
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
local function hand_on(holders, fences, fence, queue, waiters, bells, now, caller)
  local got = false
  while true do
    local w, entry = live_head(queue, waiters, now)
    if not w then return got, nil end
    local mode = entry_mode(entry)
    local ok, count = fits(holders, fences, entry_limit(entry), mode)
    if not ok then return got, w end
    redis.call('LPOP', queue)
    redis.call('HDEL', waiters, w)
    local ttl = entry_ttl(entry)
    local top, taken = grant(holders, fences, fence, w, ttl, now, mode, count == 0)
    if w == caller then
      got = true
    elseif not ring(bells, w, shared_hub(entry), top, taken, now, ttl) then
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
"""

SHARED_ACQUIRE = Script(
    "shared_acquire",
    _FENCES
    + _HELPERS
    + _SHARED_HELPERS
    + """
-- KEYS and ARGV[1..7] as the lock's acquire (ARGV[3], fair, is always '1'; ARGV[6],
-- the fences a grant takes, always '1'); ARGV[8] limit  ARGV[9] mode ('r' or 'w')
-- ARGV[10] (optional; a read/write lock's) the token of the caller's own lease of the
-- other mode: a read under the caller's write lease (a downgrade) is granted at once,
-- and so is a write over the caller's read lease if that is the only hold (an upgrade).
-- Reply {fence, pttl, server_us, taken} as the lock's; when we must wait, pttl is the
-- ms left of the hold that runs out first.
local holders, fence, queue, waiters, fences = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, ttl, bell = ARGV[1], ARGV[2], ARGV[5] .. ARGV[1]
local limit, mode = tonumber(ARGV[8]), ARGV[9]
local now = now_us()
held_now(holders, fences, now)
local held = ours(holders, fences, token, now)
if not held and redis.call('EXISTS', holders .. ':left:' .. token) == 1 then
  return {0, -2, now, 0}  -- the token's attempt was given up: as the lock's acquire
end
local server_us = 0  -- (a grant found: it was made before this call)
local mine = ARGV[10]
if not held and mine and mine ~= '' and redis.call('ZSCORE', holders, mine) then
  local writer = writer_holds(holders, fences) and redis.call('HGET', fences, '@writer')
  if (mode == 'r' and writer == mine)
      or (mode == 'w' and not writer and redis.call('ZCARD', holders) == 1) then
    forget(queue, waiters, token)
    redis.call('DEL', bell)
    local top, taken = grant(holders, fences, fence, token, ttl, now, mode)
    return {top, tonumber(ttl), now, taken}
  end
end
local first  -- the first live waiter after those served (nil: none)
if not held then
  -- the waiters before us first, in order, as many as fit
  local got
  got, first = hand_on(holders, fences, fence, queue, waiters, ARGV[5], now, token)
  if got then held, server_us = ours(holders, fences, token, now), now end
end
if held then
  -- granted to us while we were away or just now, or a retried call whose reply was lost
  forget(queue, waiters, token)
  redis.call('DEL', bell)
  return {held[1], held[2], server_us, 1}
end
local ok, count = false, 1
if not first or first == token then ok, count = fits(holders, fences, limit, mode) end
if ok then
  -- (a bell is only ever rung for a queued waiter)
  if forget(queue, waiters, token) then redis.call('DEL', bell) end
  local top, taken = grant(holders, fences, fence, token, ttl, now, mode, count == 0)
  return {top, tonumber(ttl), now, taken}
end
if ARGV[4] ~= '0' then
  local life = tonumber(ARGV[4])
  local entry = string.format('%d:%s:%d:%s', now + life * 1000, ttl, limit, mode)
  if ARGV[7] ~= '' then entry = entry .. ':' .. ARGV[7] end
  if redis.call('HSET', waiters, token, entry) == 1 then redis.call('RPUSH', queue, token) end
  keep_for(queue, life, life)
  keep_for(waiters, life, life)
end
local soonest = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
local left = soonest[2] and math.max(0, tonumber(soonest[2]) - now_ms(now)) or -2
return {0, left, now, 0}
""",
    retry="the same token again finds its own hold and reports it, or queues it once",
)

SHARED_RELEASE = Script(
    "shared_release",
    _FENCES
    + _HELPERS
    + _SHARED_HELPERS
    + """
-- KEYS as the acquire's; ARGV[1] token  ARGV[2] fair (unused)  ARGV[3] bell key prefix
-- ARGV[4] ms to remember the release (KEYS[1] .. ':released', token -> until when, for
-- a second run after a reply lost with its connection)  ARGV[5] limit  ARGV[6] mode
-- Reply 1: released (and the next waiters served), now or by an earlier run; 0: the
-- hold was not ours (it ran out, or was never granted).
local holders, fence, queue, waiters, fences = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local marks = KEYS[1] .. ':released'
local now = now_us()
held_now(holders, fences, now)
if not drop(holders, fences, ARGV[1]) then
  local mark = redis.call('ZSCORE', marks, ARGV[1])
  if mark and tonumber(mark) > now_ms(now) then return 1 end
  return 0
end
redis.call('ZREMRANGEBYSCORE', marks, '-inf', now_ms(now))
redis.call('ZADD', marks, now_ms(now) + tonumber(ARGV[4]), ARGV[1])
keep_for(marks, tonumber(ARGV[4]), tonumber(ARGV[4]))
hand_on(holders, fences, fence, queue, waiters, ARGV[3], now)
return 1
""",
    retry="a second run finds the mark the first one left and reports the release",
)

SHARED_EXTEND = Script(
    "shared_extend",
    """
-- KEYS[1] holders  KEYS[2] fences  ARGV[1] token  ARGV[2] ttl ms
-- Reply 1: the hold is ours and now runs out ttl ms from now; 0: not ours (ran out).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not until_ms or until_ms <= now_ms then return 0 end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now_ms + ttl, ARGV[1])
for _, key in ipairs(KEYS) do
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
end
return 1
""",
    retry="setting the same expiry twice is setting it once",
)

SHARED_LEAVE = Script(
    "shared_leave",
    _FENCES
    + _HELPERS
    + _SHARED_HELPERS
    + """
-- A waiter gives up: as the lock's leave. KEYS as the acquire's; ARGV[1] token
-- ARGV[2] fair (unused)  ARGV[3] bell key prefix  ARGV[4] '1': keep a hold granted to
-- us meanwhile; '0': give it back  ARGV[5] ms the attempt's mark lasts (holders ..
-- ':left:' .. token, as the lock's)  ARGV[6] limit  ARGV[7] mode
-- Reply {fence, pttl, taken}: fence > 0 when a hold was kept; {0, 0, 0} otherwise.
local holders, fence, queue, waiters, fences = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token = ARGV[1]
forget(queue, waiters, token)
redis.call('DEL', ARGV[3] .. token)
local now = now_us()
held_now(holders, fences, now)
local held = ours(holders, fences, token, now)
if held then
  if ARGV[4] == '1' then return {held[1], held[2], 1} end
  drop(holders, fences, token)
end
redis.call('SET', holders .. ':left:' .. token, '1', 'PX', ARGV[5])
-- what we held, or our place in the queue (a waiter we held back), may be due to others
hand_on(holders, fences, fence, queue, waiters, ARGV[3], now)
return {0, 0, 0}
""",
    retry="a second run finds the entry gone and the hold kept, or already given back",
)


# -- Election: who leads, and telling its observers ---------------------------------------
#
# A candidate is a waiter of a lock (the lock's scripts), whose token ends with its
# identity in hex. Observers register in a hash, token -> "deadline_us:0:1[:hub]" (a
# waiter's entry, so the lock's helpers read it), and are rung as waiters are.

ELECTION_EXTEND = Script(
    "election_extend",
    """
-- KEYS[1] lock  KEYS[2] fence  ARGV[1] token  ARGV[2] ttl ms
-- As the lock's extend; the fence counter (the leader's term, which observers read) is
-- kept at least as long as a grant keeps it, so it lasts as long as the leader.
-- Reply 1: the lock is ours and now expires ttl ms from now; 0: not ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local keep = 2 * tonumber(ARGV[2]) + @MARGIN@
if redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], keep) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
""".replace("@MARGIN@", str(FENCE_MARGIN_MS)),
    retry="setting the same expiry twice is setting it once",
)

ELECTION_WATCH = Script(
    "election_watch",
    _HELPERS
    + """
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] observers
-- ARGV[1] observer token  ARGV[2] ms to stay registered ('0': just read)  ARGV[3] its
-- hub ('': rung on its bell)
-- Reply {leader's token ('' if none), term (its fence), pttl (-2 if none)}.
if ARGV[2] ~= '0' then
  local life = tonumber(ARGV[2])
  local entry = string.format('%d:0:1', now_us() + life * 1000)
  if ARGV[3] ~= '' then entry = entry .. ':' .. ARGV[3] end
  redis.call('HSET', KEYS[3], ARGV[1], entry)
  keep_for(KEYS[3], life)
end
local holder = redis.call('GET', KEYS[1])
if not holder then return {'', 0, -2} end
return {holder, tonumber(redis.call('GET', KEYS[2])) or 0, redis.call('PTTL', KEYS[1])}
""",
    retry="registering again only moves the deadline; the rest reads",
)

ELECTION_ANNOUNCE = Script(
    "election_announce",
    _HELPERS
    + """
-- KEYS[1] lock  KEYS[2] fence  KEYS[3] observers  ARGV[1] bell key prefix
-- The leader changed (elected, resigned): ring every live observer ("term:server_us:1",
-- term 0 when nobody leads) and drop those past their deadline or unable to hear.
-- Reply: how many were rung.
local now = now_us()
local term = redis.call('EXISTS', KEYS[1]) == 1 and tonumber(redis.call('GET', KEYS[2])) or 0
local all = redis.call('HGETALL', KEYS[3])
local rung = 0
for i = 1, #all, 2 do
  local w, entry = all[i], all[i + 1]
  local life = math.ceil((entry_deadline(entry) - now) / 1000)
  if life > 0 and ring(ARGV[1], w, entry_hub(entry), term, 1, now, life) then
    rung = rung + 1
  else
    redis.call('HDEL', KEYS[3], w)
  end
end
return rung
""",
    retry="observers rung twice look again twice",
)


# -- Redlock (one script run per node; see _rules/quorum.py for how the replies are counted) --

REDLOCK_ACQUIRE = Script(
    "redlock_acquire",
    """
-- KEYS[1] lock  KEYS[2] fence
-- ARGV[1] token  ARGV[2] ttl ms  ARGV[3] the highest token this client handed out (0: none)
-- Reply {1, counter, ttl}: the lock is ours on this node for ttl ms (taken now, or taken
-- by an earlier attempt of the same acquisition whose reply was lost: set afresh), and
-- the node's fence counter, advanced by one in the same step (and raised past ARGV[3] if
-- it lags: a node that restarted empty catches up even if this reply goes unread), is
-- counter. Reply {0, 0, pttl}: held by another; pttl = its ms left (-1 no TTL, -2 gone).
"""
    + _FENCES
    + """
local function count()
  return {1, (take_fences(KEYS[2], 1, ARGV[2], tonumber(ARGV[3]), true)), tonumber(ARGV[2])}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return count()
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return count()
end
return {0, 0, redis.call('PTTL', KEYS[1])}
""",
)

REDLOCK_FENCE = Script(
    "redlock_fence",
    """
-- KEYS[1] lock  KEYS[2] fence
-- ARGV[1] token  ARGV[2] fencing token chosen by the holder  ARGV[3] ttl ms
-- Reply 1: the lock is ours on this node and its counter is now at least ARGV[2];
-- 0: not ours (nothing written: a raise counts only while we hold the node).
"""
    + _FENCES
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local wanted = tonumber(ARGV[2])
if (tonumber(redis.call('GET', KEYS[2])) or 0) < wanted then
  -- taken as one fence from a floor just below it: the same expiry rule as every grant
  take_fences(KEYS[2], 1, ARGV[3], wanted - 1, true)
end
return 1
""",
)

REDLOCK_RELEASE = Script(
    "redlock_release",
    """
-- KEYS[1] lock  ARGV[1] token
-- Reply 1: it was ours on this node and is deleted; 0: not ours (nothing changed).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
""",
)


# -- Inspection: what a name holds and who waits, for tools and ``locked()`` ------------

INSPECT = Script(
    "inspect",
    _FENCES
    + _HELPERS
    + _SHARED_HELPERS
    + """
-- Read one lock's, election's, semaphore's or read/write lock's state in one snapshot
-- judged by the server's own clock. Writes nothing: holds past their time and dead
-- waiters, which the other scripts drop as they meet them, are only left out or marked.
-- KEYS[1] lock (a semaphore's or read/write lock's: holders)  KEYS[2] fence
-- KEYS[3] queue  KEYS[4] waiters  KEYS[5] fences (semaphore, read/write lock only)
-- ARGV[1] 'shared' (KEYS[1] is a sorted set of holds) or 'single' (a lock's key)
-- ARGV[2] the bells' prefix (a waiter's hub listens on it)
-- Reply {server_us, fence counter ('' if none), holders, waiters}. holders: flat, per
-- holder {token, ms left (-1: the key has no TTL), its hold's fence ('' if the server
-- keeps none per hold), 'w' (exclusive) or 'r' (shared)}. waiters: flat, in queue
-- order, per queued token that still has an entry {token, 1 live or 0 dead (past its
-- deadline, or its hub gone: it would not be served; a caller that may not ask whether
-- a hub listens judges by the deadline alone), us from now to its entry's deadline
-- (negative: past)}.
local now = now_us()
local holders = {}
if ARGV[1] == 'shared' then
  -- the holds held_now keeps: those running out after this millisecond
  local held = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now_ms(now), '+inf', 'WITHSCORES')
  local writer = redis.call('HGET', KEYS[5], '@writer')
  for i = 1, #held, 2 do
    local token = held[i]
    local fence = redis.call('HGET', KEYS[5], token) or ''
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
for _, token in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local entry = redis.call('HGET', KEYS[4], token)
  if entry then
    waiters[#waiters + 1] = token
    local hub = ARGV[1] == 'shared' and shared_hub(entry) or entry_hub(entry)
    local live = entry_live(entry, now) and (not hub or hub_listens(ARGV[2], hub, true))
    waiters[#waiters + 1] = live and 1 or 0
    waiters[#waiters + 1] = entry_deadline(entry) - now
  end
end
return {now, redis.call('GET', KEYS[2]) or '', holders, waiters}
""",
    retry="it only reads",
)

FENCED_APPLY = Script(
    "fenced_apply",
    """
-- The fence gate for Redis data: run the commands only if the fence is not older than
-- the greatest recorded for the resource, and record it (kept ARGV[2] ms from now).
-- KEYS[1] the record (P{N}:gate)  KEYS[1 + i] the key command i writes
-- ARGV[1] fence  ARGV[2] ms to keep the record  ARGV[3..] per command: how many words
-- follow its key, its name, then those words
-- Reply {1, reply of each command}; {0, the greater fence recorded}: stale, nothing run;
-- {-1, i, error}: command i failed (the ones before it stand, as in any script).
local fence = tonumber(ARGV[1])
local seen = tonumber(redis.call('GET', KEYS[1]))
if seen and seen > fence then
  return {0, string.format('%d', seen)}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local replies, at = {1}, 3
for i = 2, #KEYS do
  local rest = tonumber(ARGV[at])
  local words = {ARGV[at + 1], KEYS[i]}
  for j = 1, rest do
    words[j + 2] = ARGV[at + 1 + j]
  end
  at = at + rest + 2
  local reply = redis.pcall(unpack(words))
  if type(reply) == 'table' and reply.err then
    return {-1, i - 1, reply.err}
  end
  replies[i] = reply
end
return replies
""",
)

FENCED_READ = Script(
    "fenced_read",
    """
-- The greatest fence the gate for Redis data has recorded for a resource.
-- KEYS[1] the record  Reply: the fence, or false if none is recorded (or it has expired)
return redis.call('GET', KEYS[1])
""",
    retry="it only reads",
)


# Scheduled jobs (``redlease.once``): a lock's scripts, wrapped. Each runs the lock's own
# script as a function, so a job's lease is a lock's lease on the same keys (a Lock of the
# name waits for it, ``redlease inspect`` shows it).

_NOW_MS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

ONCE_ACQUIRE = Script(
    "once_acquire",
    """
-- A scheduled job's try: the lock's acquire (never queued), unless the job's run of this
-- period has been made.
-- KEYS[1..4] as acquire's  KEYS[5] the record of the last period run (P{N}:once,
-- "period:token")
-- ARGV[1..7] as acquire's (ARGV[4] '0')  ARGV[8] the period in ms ('0': none)
-- Reply as acquire's, but server_us is always the server's time before the grant (when
-- the run starts), and fence = -1 when this period's run has been made (pttl: ms until
-- the next period begins, or the name is free if that is later). Periods are aligned to
-- the server's clock: period k covers [k * period, (k + 1) * period) of its TIME in ms.
local function acquire()
"""
    + ACQUIRE.source
    + """
end
"""
    + _NOW_MS
    + """
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local period = tonumber(ARGV[8])
local k
if period > 0 then
  k = math.floor(now / period)
  local last = tonumber(string.match(redis.call('GET', KEYS[5]) or '', '^(%d+)'))
  -- (greater: a server whose clock went back, a replica promoted, has seen a later one;
  -- a try sent again after its reply was lost finds its own grant in acquire)
  if last and last >= k and redis.call('GET', KEYS[1]) ~= ARGV[1] then
    -- may run again when the next period begins and the name is free (a run, or its
    -- at-least time, may hold it past the period's end)
    return {-1, math.max((k + 1) * period - now, redis.call('PTTL', KEYS[1])), now_us, 0}
  end
end
local reply = acquire()
if reply[1] > 0 and period > 0 then
  -- "k:token", kept until the period ends: a run counts from its start, however it ends
  -- (a try given up before its run, ONCE_LEAVE, takes its record back)
  redis.call('SET', KEYS[5], string.format('%d', k) .. ':' .. ARGV[1], 'PX', (k + 1) * period - now)
end
reply[3] = now_us
return reply
""",
    retry="the same token again finds its own grant (and the period's record) and reports it",
)

ONCE_LEAVE = Script(
    "once_leave",
    """
-- A scheduled job's try given up (interrupted, or its grant came too late): the lock's
-- leave, and the period's record taken back if this try wrote it (its run never began).
-- KEYS as ONCE_ACQUIRE's  ARGV[1..5] as leave's (ARGV[4] '0')  Reply as leave's.
local function leave()
"""
    + LEAVE.source
    + """
end
local record = redis.call('GET', KEYS[5])
if record and string.match(record, ':(%x+)$') == ARGV[1] then redis.call('DEL', KEYS[5]) end
return leave()
""",
    retry="a second run finds the record and the grant gone",
)

ONCE_RELEASE = Script(
    "once_release",
    """
-- A scheduled job's end: the lock's release, unless the job's at-least time has not
-- passed yet, by the server's clock; then the lock is kept until it has.
-- KEYS as release's  ARGV[1..4] as release's  ARGV[5] the server's ms until which the
-- name stays held (the run's start plus at-least)
-- Reply as release's: 1 released, or kept until ARGV[5]; 0 not ours.
local function release()
"""
    + RELEASE.source
    + """
end
"""
    + _NOW_MS
    + """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local left = tonumber(ARGV[5]) - now_ms()
  if left > 0 then
    redis.call('PEXPIRE', KEYS[1], left)
    return 1
  end
end
return release()
""",
    retry="a second run keeps the lock until the same time, or finds the first one's release",
)

ONCE_EXTEND = Script(
    "once_extend",
    _NOW_MS
    + """
-- A scheduled job's extend: the lock's, never past the server's ms at which the job's
-- at-most time ends, and never shortening it: a renewal that reaches the server after
-- the run's release kept the name for its at-least time must not cut that short (while
-- the run holds it, its expiry is never later than this extend's).
-- KEYS[1] lock  ARGV[1] token  ARGV[2] ttl ms  ARGV[3] the server's ms of the at-most end
-- Reply: the ms the lease now lasts (> 0); 0: not ours (or its at-most time is over).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local left = math.min(tonumber(ARGV[2]), tonumber(ARGV[3]) - now_ms())
if left <= 0 then return 0 end
local kept = redis.call('PTTL', KEYS[1])
if kept > left then return kept end
redis.call('PEXPIRE', KEYS[1], left)
return left
""",
    retry="setting the expiry again only shortens it by the time between the two",
)
