-- Taking fences: every script that grants includes it (the acquire's fast path first).
--@include constants
--@include clock

-- How many of n fences to take above base (at server time now, us) for a lease of ttl ms:
-- the highest, how many, and how long the counter must then live (until the clock has
-- passed it)
local function plan_fences(base, n, ttl, now)
  local taken = math.min(num(n), math.max(1, now + FENCE_LEAD_US - base))
  local top = base + taken
  local ahead_ms = math.max(0, math.ceil((top - now) / 1000))
  return top, taken, 2 * num(ttl) + FENCE_MARGIN_MS + ahead_ms
end

-- (raised before the counter is written, or once its value is put back)
local function past_the_limit(f)
  error('redlease: the fence counter ' .. f .. ' would pass 2^53 (is the server clock right?)')
end

-- Take up to n fences from the counter F for a lease of ttl ms; return the highest and
-- how many were taken. Fences follow the server's clock, in microseconds: a grant takes
-- them above both the counter and the clock (or, dense, above the counter alone, which
-- starts at the clock: a Redlock's nodes then stay in step), and above floor. A counter
-- never runs more than LEAD us ahead of the clock (a grant that would take it further
-- takes fewer fences, at least one) and expires only once the clock has passed it, so
-- one lost with the server's data, expired, or (not dense) left behind on a replica
-- promoted in a failover, still leads to greater fences. See docs/design.md, "Fences".
-- now: the server's time in us if the caller has read it in this run (else read here).
-- (A number goes to the server as its digits, exact below 2^53: FENCE_LIMIT.)
local function take_fences(f, n, ttl, floor, dense, now)
  now = now or now_us()
  if dense then
    local base = math.max(tonumber(redis.call('GET', f)) or now, floor)
    local top, taken, keep = plan_fences(base, n, ttl, now)
    if top >= FENCE_LIMIT then past_the_limit(f) end
    redis.call('SET', f, top, 'PX', keep)
    return top, taken
  end
  -- A counter is mostly behind the clock: one SET takes fences above the clock and reads
  -- what the counter held; one that was ahead is set again, above that.
  local base = math.max(now, floor)
  local top, taken, keep = plan_fences(base, n, ttl, now)
  if top >= FENCE_LIMIT then past_the_limit(f) end
  -- (what it held: a number, or nil if none; one that is not a number is written over)
  local last = tonumber(redis.call('SET', f, top, 'PX', keep, 'GET'))
  if last and last > base then
    local again, again_taken, again_keep = plan_fences(last, n, ttl, now)
    if again >= FENCE_LIMIT then
      -- (its value back, for an ordinary grant's keep: once a wrong clock is put right,
      -- the name works again when it expires)
      redis.call('SET', f, last, 'PX', keep)
      past_the_limit(f)
    end
    redis.call('SET', f, again, 'PX', again_keep)
    return again, again_taken
  end
  return top, taken
end
