-- ADMIT: the job library's KEYS and ARGV[1..7] (library.lua), then
-- KEYS[2] recent job ids (list, newest first), KEYS[3] rejection counts (hash),
-- KEYS[4] the owner's unfinished job ids (set), KEYS[5] the unfinished batch lines' job ids
-- (set; for a batch line KEYS[4] is that set too, and ARGV[16] the batch lines' share).
-- ARGV[8] job id, ARGV[9] limit, ARGV[10] queued lease (ms), ARGV[11] owner, ARGV[12] model,
-- ARGV[13] the most expired leases to reap first, ARGV[14] how many recent job ids to keep,
-- ARGV[15] the error type a refusal is counted under, ARGV[16] the owner's own limit
-- (0: none), ARGV[17] the error type an owner's refusal is counted under, ARGV[18] 1 when
-- batch lines do not count against ARGV[9] (interactive jobs), 0 when they do (batch lines:
-- they take only spare capacity, and never the slots interactive jobs are admitted to),
-- ARGV[19] n, then n name, value pairs of further job hash fields (a webhook's), then the
-- queue entry's TTL in seconds ('' for none) and its record's name, value pairs; with an
-- entry, KEYS[6] the set of queues, KEYS[7] the queue, KEYS[8] the job's queue record (RQ's
-- job hash: `scripts.Enqueue`). An admitted job gets them in this script, never later.
-- A job placed by prefix (`shared.redis.placement`; 12 KEYS) has KEYS[9] the model's
-- placement workers (zset), KEYS[10] the chosen worker's queue of its priority, and the
-- worker's name after the entry's TTL: it goes to that queue while the worker is listed
-- live there (a worker that left or died hands its queue back in the script that unlists it,
-- so nothing is placed on it after), else to KEYS[7]; the record's origin is KEYS[7] either way.
-- Returns {1, in_flight} when admitted, {0, in_flight} when the global limit is reached,
-- {-1, owner_in_flight} when the owner's limit is; each followed by the ids of running jobs
-- the reaping failed with the lease-expired error (their RQ registries still call them started).
local id, limit, lease_ms = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
local now, stamp = now_ms()
local lost = reap(now, tonumber(ARGV[13]))
local owner_limit = tonumber(ARGV[16])
if owner_limit > 0 then
  local owner_in_flight = redis.call('SCARD', KEYS[4])
  if owner_in_flight >= owner_limit then
    redis.call('HINCRBY', KEYS[3], ARGV[17], 1)
    return {-1, owner_in_flight, unpack(lost)}
  end
end
local in_flight = redis.call('ZCARD', LEASES)
if ARGV[18] == '1' then
  in_flight = in_flight - redis.call('SCARD', KEYS[5])
end
if in_flight >= limit then
  redis.call('HINCRBY', KEYS[3], ARGV[15], 1)
  return {0, in_flight, unpack(lost)}
end
redis.call('ZADD', LEASES, now + lease_ms, id)
redis.call('SADD', KEYS[4], id)
local extra = tonumber(ARGV[19])
redis.call('HSET', key(T_HASH, id), F_STATUS, S_QUEUED, F_OWNER, ARGV[11], F_MODEL, ARGV[12],
  F_CREATED_AT, stamp, F_OWNER_JOBS, KEYS[4], unpack(ARGV, 20, 19 + 2 * extra))
local entry_ttl = ARGV[20 + 2 * extra]
if entry_ttl ~= '' then
  local record, queue = 21 + 2 * extra, KEYS[7]
  if #KEYS == 12 then
    local expiry = redis.call('ZSCORE', KEYS[9], ARGV[record])
    if expiry and tonumber(expiry) > now then
      queue = KEYS[10]
    end
    record = record + 1
  end
  redis.call('SADD', KEYS[6], KEYS[7])
  redis.call('HSET', KEYS[8], unpack(ARGV, record, #ARGV))
  redis.call('EXPIRE', KEYS[8], entry_ttl)
  redis.call('RPUSH', queue, id)
end
redis.call('LPUSH', KEYS[2], id)
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[14]) - 1)
return {1, in_flight + 1, unpack(lost)}
