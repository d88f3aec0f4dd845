-- RENEW (after clock.lua): KEYS[1] the lease set, KEYS[2..] the jobs' hashes;
-- ARGV[1] lease TTL (ms), ARGV[2] the job hash's cancel flag field (`JobField`),
-- ARGV[3..] job ids, in the order of their hashes in KEYS.
-- Extends each unexpired lease. Returns {ids whose lease had expired or was gone, ids of
-- jobs asked to stop}: a cancel is announced on the cancel channel, and a worker between
-- pub/sub connections misses it; it still stops the job at this renewal.
local now = now_ms()
local lost, cancelled = {}, {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local expiry = redis.call('ZSCORE', KEYS[1], id)
  if expiry and tonumber(expiry) > now then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), id)
    if redis.call('HGET', KEYS[i - 1], ARGV[2]) then
      table.insert(cancelled, id)
    end
  else
    table.insert(lost, id)
  end
end
return {lost, cancelled}
