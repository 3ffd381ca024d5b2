-- KEYS[1] lock  KEYS[2] fence  KEYS[3] observers  ARGV[1] bell key prefix
-- The leader changed (elected, resigned): ring every live observer ("term:server_us:1",
-- term 0 when nobody leads) and drop those past their deadline or unable to hear.
-- Reply: how many were rung.
--@include waiters
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
