-- The server's clock, prepended to every script that reads the time (`shared.redis.scripts`).
-- No KEYS or ARGV of its own. Time comes from Redis, so API and worker clocks never matter.

-- The only `TIME` call in tokenrelay's Lua. Returns milliseconds since the epoch (lease and
-- heartbeat scores) and, from the same reading, seconds with microseconds as text (the job
-- hash's `*_at` fields, which clients read as floats): deriving that text from the
-- milliseconds would cut it to milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return ms, t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end
