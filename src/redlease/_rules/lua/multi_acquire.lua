-- Take several locks at once, all or none: a MultiLock's try when its names share a
-- server (and, on a Cluster, a slot). KEYS: each lock's key, fence counter and queue, in
-- turn  ARGV[1] token  ARGV[2] ttl ms
-- Reply {fence of each}: all taken, with one token (a lock held with it already, by an
-- earlier run whose reply was lost, is ours: its fence is its counter's); {}: one of
-- them is held by another, or has waiters (who come first), so none is taken; or the
-- try was given up (its clean-up, a LEAVE of each name in turn, marked the first).
--@include fences
local n = #KEYS / 3
if redis.call('GET', KEYS[1] .. ':mark:' .. ARGV[1]) == 'left' then return {} end
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
