-- A scheduled job's try given up (interrupted, or its grant came too late): the lock's
-- leave, and the period's record taken back if this try wrote it (its run never began).
-- KEYS as ONCE_ACQUIRE's  ARGV[1..6] as leave's (ARGV[4] '0')  Reply as leave's.
local function leave()
--@include leave

end
local record = redis.call('GET', KEYS[4])
if record and string.match(record, ':(%x+)$') == ARGV[1] then redis.call('DEL', KEYS[4]) end
return leave()
