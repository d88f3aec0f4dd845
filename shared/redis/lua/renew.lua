-- RENEW (after clock.lua): KEYS[1] the lease set, KEYS[2..] the jobs' hashes;
-- ARGV[1] lease TTL (ms), ARGV[2] the job hash's status field, ARGV[3] the running status,
-- ARGV[4] its cancel flag field (`JobField`), ARGV[5..] job ids, in the order of their
-- hashes in KEYS.
-- Extends each unexpired lease of a running job. Returns {ids whose lease had expired or was
-- gone, ids of jobs asked to stop}: a cancel is announced on the cancel channel, and a
-- worker between pub/sub connections misses it; it still stops the job at this renewal.
-- A queued job keeps its lease, the deadline of its queue wait: after a failover, a worker
-- may renew a job that it started on the old primary and that the new one still holds
-- queued, which a shorter lease would expire before another worker took it.
local now = now_ms()
local lost, cancelled = {}, {}
for i = 5, #ARGV do
  local id, h = ARGV[i], KEYS[i - 3]
  local expiry = redis.call('ZSCORE', KEYS[1], id)
  if not expiry or tonumber(expiry) <= now then
    table.insert(lost, id)
  elseif redis.call('HGET', h, ARGV[2]) == ARGV[3] then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), id)
    if redis.call('HGET', h, ARGV[4]) then
      table.insert(cancelled, id)
    end
  end
end
return {lost, cancelled}
