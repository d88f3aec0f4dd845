-- LIVE_MODELS (after clock.lua): KEYS[1] the model index; no ARGV.
-- Returns {models with a live worker, every model ever served}.
local now = now_ms()
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
return {live, redis.call('ZRANGE', KEYS[1], 0, -1)}
