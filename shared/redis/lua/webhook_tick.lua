-- WEBHOOK_TICK (after clock.lua): KEYS[1] the delivery queue, KEYS[2] the retry set,
-- KEYS[3] the dispatcher set.
-- ARGV[1] this dispatcher's id, ARGV[2] visibility timeout (ms), ARGV[3] processing-list key
-- template (`{id}` stands for a dispatcher id), ARGV[4] the most retries and dead dispatchers
-- to handle in one call.
-- Renews this dispatcher's heartbeat, moves due retries to the taking end of the queue, and
-- hands the processing lists of dispatchers whose heartbeat ran out back to the queue.
-- Returns {retries moved, deliveries recovered}.
local now = now_ms()
local max = tonumber(ARGV[4])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, max)
for _, record in ipairs(due) do
  redis.call('ZREM', KEYS[2], record)
  redis.call('RPUSH', KEYS[1], record)
end
local recovered = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, max)) do
  local processing = string.gsub(ARGV[3], '{id}', function() return id end)
  while redis.call('LMOVE', processing, KEYS[1], 'LEFT', 'RIGHT') do
    recovered = recovered + 1
  end
  redis.call('ZREM', KEYS[3], id)
end
return {#due, recovered}
