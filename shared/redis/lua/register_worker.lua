-- REGISTER_WORKER (after clock.lua): KEYS[1] the model index (zset), KEYS[2] this worker's
-- hash. ARGV[1] model, ARGV[2] capacity (jobs at once), ARGV[3] heartbeat TTL (ms).
-- Records the worker and marks its model live until the heartbeat expires.
local now = now_ms()
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[2], 'model', ARGV[1], 'capacity', ARGV[2], 'heartbeat_ms', now)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[1], 'GT', now + ttl, ARGV[1])
return now + ttl
