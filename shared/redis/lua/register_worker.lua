-- REGISTER_WORKER (after clock.lua): KEYS[1] the model index (zset), KEYS[2] this worker's
-- hash, KEYS[3] the model's placement workers (zset). ARGV[1] model, ARGV[2] capacity (jobs
-- at once), ARGV[3] heartbeat TTL (ms), ARGV[4] this worker's name, ARGV[5] '1' while it
-- takes jobs placed by prefix ('0' once it leaves: `shared.redis.placement`).
-- Records the worker and marks its model live until the heartbeat expires.
local now = now_ms()
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[2], 'model', ARGV[1], 'capacity', ARGV[2], 'heartbeat_ms', now)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[1], 'GT', now + ttl, ARGV[1])
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[3], now + ttl, ARGV[4])
end
return now + ttl
