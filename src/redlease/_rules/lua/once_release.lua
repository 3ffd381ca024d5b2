-- A scheduled job's end: the lock's release, unless the job's at-least time has not
-- passed yet, by the server's clock; then the lock is kept until it has.
-- KEYS as release's  ARGV[1..4] as release's  ARGV[5] the server's ms until which the
-- name stays held (the run's start plus at-least)
-- Reply as release's: 1 released, or kept until ARGV[5]; 0 not ours.
--@include clock
local function release()
--@include release
end

if redis.call('GET', KEYS[1]) == ARGV[1] then
  local left = tonumber(ARGV[5]) - server_ms()
  if left > 0 then
    redis.call('PEXPIRE', KEYS[1], left)
    return 1
  end
end
return release()
