-- KEYS[1] lock  KEYS[2] fence  KEYS[3] observers
-- ARGV[1] observer token  ARGV[2] ms to stay registered ('0': just read)  ARGV[3] its
-- hub ('': rung on its bell)
-- Reply {leader's token ('' if none), term (its fence), pttl (-2 if none)}.
--@include waiters
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
