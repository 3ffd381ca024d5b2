-- Taking fences: every script that grants includes it (the acquire's fast path first).
--@include constants

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
  local taken = math.min(tonumber(n), math.max(1, now + FENCE_LEAD_US - base))
  local top = base + taken
  if top >= FENCE_LIMIT then
    error('redlease: the fence counter ' .. f .. ' would pass 2^53 (is the server clock right?)')
  end
  local keep = 2 * tonumber(ttl) + FENCE_MARGIN_MS + math.max(0, math.ceil((top - now) / 1000))
  redis.call('SET', f, string.format('%d', top), 'PX', keep)
  return top, taken
end
