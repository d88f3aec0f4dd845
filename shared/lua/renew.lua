-- RENEW (after clock.lua): KEYS[1] the lease set; ARGV[1] lease TTL (ms); ARGV[2..] job ids.
-- Extends each unexpired lease; returns the ids whose lease had expired or was gone.
local now = now_ms()
local lost = {}
for i = 2, #ARGV do
  local expiry = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if expiry and tonumber(expiry) > now then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
