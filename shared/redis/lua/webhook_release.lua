-- WEBHOOK_RELEASE: KEYS[1] this dispatcher's processing list, KEYS[2] the delivery queue,
-- KEYS[3] the dispatcher set. ARGV[1] this dispatcher's id.
-- Hands every delivery still held back to the taking end of the queue and deregisters.
-- Returns how many it handed back.
local moved = 0
while redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') do
  moved = moved + 1
end
redis.call('ZREM', KEYS[3], ARGV[1])
return moved
