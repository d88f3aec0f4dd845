-- RENEW (after clock.lua): KEYS[1] the lease set, KEYS[2..] the jobs' hashes;
-- ARGV[1] lease TTL (ms), ARGV[2] the job hash's status field, ARGV[3] the running status,
-- ARGV[4] its cancel flag field, ARGV[5] its worker field (`JobField`), ARGV[6] the renewing
-- worker ('' for any), ARGV[7..] job ids, in the order of their hashes in KEYS.
-- Extends each unexpired lease of a running job. Returns {ids whose lease had expired or was
-- gone, or whose job another worker runs now (a continuation: the reaper had put it back in
-- its queue), ids of jobs asked to stop}: a cancel is announced on the cancel channel, and a
-- worker between pub/sub connections misses it; it still stops the job at this renewal.
-- A queued job keeps its lease, the deadline of its queue wait: after a failover, a worker
-- may renew a job that it started on the old primary and that the new one still holds
-- queued, which a shorter lease would expire before another worker took it.
local now = now_ms()
local lost, cancelled = {}, {}
for i = 7, #ARGV do
  local id, h = ARGV[i], KEYS[i - 5]
  local expiry = redis.call('ZSCORE', KEYS[1], id)
  local status, cancel, worker = unpack(redis.call('HMGET', h, ARGV[2], ARGV[4], ARGV[5]))
  if not expiry or tonumber(expiry) <= now
      or (ARGV[6] ~= '' and status == ARGV[3] and worker ~= ARGV[6]) then
    table.insert(lost, id)
  elseif status == ARGV[3] then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), id)
    if cancel then
      table.insert(cancelled, id)
    end
  end
end
return {lost, cancelled}
