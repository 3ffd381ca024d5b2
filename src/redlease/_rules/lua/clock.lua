-- The server's clock, and numbers read from its strings.

-- a number from a string of decimal digits (a reply, an argument, a field of an entry):
-- one conversion, where tonumber makes two (and the server pays for each)
local function num(digits) return digits + 0 end

-- a time in ms as a reply's digits, without a format: Lua writes a number with 14
-- significant digits, so a larger one (the TTL of someone else's key, thousands of
-- years) is said as the largest it writes exactly, which waits as long
local function ms_digits(ms) return math.min(ms, 99999999999999) .. '' end

-- the server's time in microseconds, and TIME's reply (its seconds and microseconds as
-- digits: a reply can carry them as they are, where a number this large would need a
-- format)
local function now_us()
  local t = redis.call('TIME')
  return num(t[1]) * 1000000 + num(t[2]), t
end

-- the server's clock in milliseconds
local function server_ms()
  local t = redis.call('TIME')
  return num(t[1]) * 1000 + math.floor(num(t[2]) / 1000)
end
