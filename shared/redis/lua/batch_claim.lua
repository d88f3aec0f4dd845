-- BATCH_CLAIM (after clock.lua): the feeder leases on unfinished batches.
-- KEYS[1] the active batches (sorted set: batch id -> lease expiry in ms, 0 unclaimed).
-- ARGV[1] the feeder's id, ARGV[2] lease (ms), ARGV[3] the most batches to claim now,
-- ARGV[4] the batch hash key template, ARGV[5] the batch hash's feeder field,
-- ARGV[6..] the ids of the batches this feeder holds, to renew.
-- Renews each held batch still this feeder's, claims batches whose lease ran out (or that
-- nobody held yet). Returns {claimed ids, lost ids (held no more)}.
local now = now_ms()
local me, lease_ms, max_new = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local function batch_key(id)
  return (string.gsub(ARGV[4], '{id}', id))
end
local lost = {}
for i = 6, #ARGV do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and redis.call('HGET', batch_key(id), ARGV[5]) == me then
    redis.call('ZADD', KEYS[1], now + lease_ms, id)
  else
    table.insert(lost, id)
  end
end
local claimed = {}
if max_new > 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, max_new)) do
    redis.call('ZADD', KEYS[1], now + lease_ms, id)
    redis.call('HSET', batch_key(id), ARGV[5], me)
    table.insert(claimed, id)
  end
end
return {claimed, lost}
