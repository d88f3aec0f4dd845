-- WEBHOOK_RESCHEDULE (after clock.lua): KEYS[1] this dispatcher's processing list,
-- KEYS[2] the retry set.
-- ARGV[1] the record as taken, ARGV[2] the record of the next attempt, ARGV[3] delay (ms).
-- Returns 1 when rescheduled; 0 when the record was no longer held here (another dispatcher
-- took this one for dead and handed it back to the queue: it is not scheduled twice).
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
local now = now_ms()
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
return 1
