-- A scheduled job's try: the lock's acquire (never queued), unless the job's run of this
-- period has been made.
-- KEYS[1..3] as acquire's  KEYS[4] the record of the last period run (P{N}:once,
-- "period:token")
-- ARGV[1..9] as acquire's (ARGV[4] '0')  ARGV[10] the period in ms ('0': none)
-- Reply as acquire's (see acquire.lua), but a grant is always the table, whose server_us
-- is the server's time before the grant (when the run starts); {-1, pttl, server_us, 0,
-- ''} when this period's run has been made (pttl: ms until the next period begins, or
-- the name is free if that is later). Periods are aligned to
-- the server's clock: period k covers [k * period, (k + 1) * period) of its TIME in ms.
local function acquire()
--@include acquire
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local period = tonumber(ARGV[10])
local k
if period > 0 then
  k = math.floor(now / period)
  local last = tonumber(string.match(redis.call('GET', KEYS[4]) or '', '^(%d+)'))
  -- (greater: a server whose clock went back, a replica promoted, has seen a later one;
  -- a try sent again after its reply was lost finds its own grant in acquire)
  if last and last >= k and redis.call('GET', KEYS[1]) ~= ARGV[1] then
    -- may run again when the next period begins and the name is free (a run, or its
    -- at-least time, may hold it past the period's end)
    return {-1, math.max((k + 1) * period - now, redis.call('PTTL', KEYS[1])), now_us, 0, ''}
  end
end
local reply = acquire()
if type(reply) == 'string' then return reply end  -- nothing granted: as it is
if type(reply) == 'number' then reply = {reply, tonumber(ARGV[2]), 0, 1, ''} end
if reply[1] > 0 and period > 0 then
  -- "k:token", kept until the period ends: a run counts from its start, however it ends
  -- (a try given up before its run, ONCE_LEAVE, takes its record back)
  redis.call('SET', KEYS[4], string.format('%d', k) .. ':' .. ARGV[1], 'PX', (k + 1) * period - now)
end
reply[3] = now_us
return reply
