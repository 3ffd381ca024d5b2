-- Waiters: their places in the queue, the first live one, and ringing them.
--
-- Shared by the lock scripts (KEYS[1..3] = lock, fence, queue; see _rules/keys.py):
--   * a waiter's place is one item of the queue (a list, in arrival order),
--     "token|entry", its entry "deadline_us:ttl_ms:since_us[:hub]" (since: when it first
--     queued, kept across its tries by an unfair lock, the only one that reads it; a
--     shared hold's entry is its own, see holds.lua); an entry past its deadline belongs
--     to a waiter that gave up or died and is skipped. The place is the whole item, so
--     a waiter's next try finds it with LPOS, and but for the rare search below nothing
--     but the list is written to queue it or to serve it. A try is told its place (the
--     acquire's reply) and sends it with its next try and its LEAVE: '' for none (a
--     first try), '?' when the token may be queued but its place is not known (a first
--     try that may be sent twice, or whose reply was lost). A place not found where it
--     was (renewed by a later try that landed first, dropped as dead) and '?' are
--     searched for by token, and then every item of the token found goes but the one
--     kept: the token is queued once, whatever order its tries land in, as long as a
--     try may land late. A first try that lands after a later one queued the token
--     anew, after a search, finds that try's mark (the lock's key .. ':mark:' .. token =
--     'requeued', the key of the mark of an attempt given up, 'left', which it never
--     overwrites; kept as long, ARGV[9]) and searches too;
--   * a waiter is rung with "fence:server_us:taken": a fence > 0 means the lock was granted
--     to that waiter at server time server_us, with taken fences; fence 0 is a plain
--     wake-up. A waiter with a hub (its process's shared wait connection, see
--     _sync/hub.py) is rung by a PUBLISH (SPUBLISH for a hub on a Cluster node, whose id
--     starts with "s") of "token:fence:server_us:taken" on its hub's channel (bell prefix
--     .. "@" .. hub), made only if the hub listens on that server (PUBSUB NUMSUB): one
--     that does not tells that the waiter's process, or its connection, is gone (or
--     listens on another server, which must not hear of a grant): the waiter is dropped
--     and the next one served, at once.
--     A waiter without a hub has a doorbell list (bell prefix .. token), pushed;
--   * a grant takes a fence from the name's counter (take_fences, fences.lua), greater than
--     every one before. (take_fences can take several at once, and replies and rings
--     carry how many were taken; every grant asks for one.)
-- The bell keys are built inside the scripts from a prefix that carries the lock's hash
-- tag, so they are in the same slot as KEYS[1] (Cluster runs them on the right node).
--@include clock

-- every key we write keeps a TTL: extend KEY to at least MS milliseconds; by HEADROOM
-- more when it must be extended, so that callers asking for about the same time one
-- after another (a queue's waiters) read its TTL without setting it each time
local function keep_for(key, ms, headroom)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms + (headroom or 0)) end
end

-- An entry's fields are read with plain finds (cheaper for the server than a pattern).

-- the first field of an entry (its deadline, us)
local function entry_deadline(entry)
  return num(string.sub(entry, 1, string.find(entry, ':', 1, true) - 1))
end

-- every field of an entry: its deadline (us), its ttl (ms, a string) and the rest as
-- strings (a lock's: since, hub; a shared hold's: limit, mode, hub), nil past its end
local function entry_fields(entry)
  local a = string.find(entry, ':', 1, true)
  local b = string.find(entry, ':', a + 1, true)
  local c = string.find(entry, ':', b + 1, true)
  local d = c and string.find(entry, ':', c + 1, true)
  return num(string.sub(entry, 1, a - 1)), string.sub(entry, a + 1, b - 1),
    string.sub(entry, b + 1, (c or 0) - 1), c and string.sub(entry, c + 1, (d or 0) - 1),
    d and string.sub(entry, d + 1)
end

local function entry_since(entry) return num((select(3, entry_fields(entry)))) end
local function entry_hub(entry) return (select(4, entry_fields(entry))) end

-- whether a waiter's entry is still within its deadline at server time NOW (us): the one
-- rule for which waiters count (live_head below, and INSPECT's report)
local function entry_live(entry, now) return entry_deadline(entry) >= now end

-- a queue item's token and entry (nil: not an item)
local function item_of(item)
  local bar = string.find(item, '|', 1, true)
  if bar then return string.sub(item, 1, bar - 1), string.sub(item, bar + 1) end
end

-- the first waiter still within its deadline (dead ones are dropped), its entry, and the
-- server time NOW (us; read here if nil and there is a waiter to judge); nil if none.
-- With POP the live one found is taken out of the queue too; without, ITEM is the head
-- if the caller has read it already.
local function live_head(queue, now, pop, item)
  while true do
    if pop then item = redis.call('LPOP', queue)
    elseif not item then item = redis.call('LINDEX', queue, 0) end
    if not item then return nil, nil, now end
    now = now or now_us()
    local w, entry = item_of(item)
    if entry and entry_live(entry, now) then return w, entry, now end
    if not pop then redis.call('LPOP', queue) end
    item = nil
  end
end

-- every item of token, in order, and the first one's index (one pass over the queue)
local function search(queue, token)
  local mine, found, first = token .. '|', {}, nil
  for i, item in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    if string.sub(item, 1, #mine) == mine then
      found[#found + 1] = item
      first = first or i - 1
    end
  end
  return found, first
end

-- token's item in the queue from its PLACE (see above), its index, and the token's other
-- items (a list, or nil: none; nil for all: not queued). SEARCHED is true when the queue
-- had to be searched.
local function find(queue, token, place)
  if place == '' then return nil end
  if place ~= '?' then
    local at = redis.call('LPOS', queue, place)
    if at then return place, at, nil, false end
  end
  local found, at = search(queue, token)
  return found[1], at, {unpack(found, 2)}, true
end

-- take ITEMS (a list, or nil: none) out of the queue
local function drop_items(queue, items)
  for _, item in ipairs(items or {}) do redis.call('LREM', queue, 1, item) end
end

-- take token out of the queue (its PLACE, see above); whether it was queued
local function forget(queue, token, place)
  local item, _, others = find(queue, token, place)
  if not item then return false end
  redis.call('LREM', queue, 1, item)
  drop_items(queue, others)
  return true
end

-- queue token's new place, ITEM, for LIFE ms: at index AT, where find found its earlier
-- item, or (AT nil) at the back, and then, if the queue was SEARCHED for it, marked for
-- MARK_MS (see above: as long as a try of the token may still land); its OTHERS go. The
-- queue is kept at least LIFE ms (so every live entry outlives it), with headroom so
-- that the waiters that follow mostly just read its TTL.
local function put(lock, queue, token, item, at, others, searched, life, mark_ms)
  if at then
    redis.call('LSET', queue, at, item)
    drop_items(queue, others)
  else
    redis.call('RPUSH', queue, item)
    if searched then
      redis.call('SET', lock .. ':mark:' .. token, 'requeued', 'PX', mark_ms)
    end
  end
  keep_for(queue, life, life)
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
