-- START: the job library's KEYS and ARGV[1..7] (library.lua), then
-- ARGV[8] job id, ARGV[9] worker name, ARGV[10] lease TTL (ms), ARGV[11] Started event.
-- Returns the running status when this worker now owns the job, else the status that stops
-- it (expired when its queue wait ran out, or the terminal status it already has); false
-- when the job is unknown or another worker runs it (a job given back to its queue after a
-- failover may be dequeued twice). Queues the job's `start` webhook delivery, if it has one.
-- A resend (the reply to the first call was lost) finds the job running here: running.
-- Appends the Started event where the token plane is here, with the job's queue wait as its
-- last field (`queue_wait_s`: seconds from `created_at` to this start, both Redis TIME), so
-- its reader need not read them from the job hash, and publishes it on the reader's channel
-- where the job has one (library.lua); on a token plane of its own the worker appends it
-- (OPEN) once this call said running, without one.
local id = ARGV[8]
local h = key(T_HASH, id)
local current, worker, url, events, created, reader = unpack(redis.call('HMGET', h, F_STATUS,
  F_WORKER, F_WEBHOOK, F_WEBHOOK_EVENTS, F_CREATED_AT, F_READER))
if current == S_RUNNING then
  return worker == ARGV[9] and S_RUNNING
end
if current ~= S_QUEUED then
  return current
end
local now, stamp = now_ms()
local expiry = redis.call('ZSCORE', LEASES, id)
if (not expiry) or tonumber(expiry) <= now then
  fail(id, S_EXPIRED, 'queue_wait_expired')
  return S_EXPIRED
end
redis.call('HSET', h, F_STATUS, S_RUNNING, F_STARTED_AT, stamp, F_WORKER, ARGV[9])
redis.call('ZADD', LEASES, now + tonumber(ARGV[10]), id)
if PLANE_HERE then
  local started = ARGV[11]
  if created then
    local wait = math.max(0, tonumber(stamp) - tonumber(created))
    started = string.sub(started, 1, -2) .. string.format(',"queue_wait_s":%.6f}', wait)
  end
  emit(id, reader, started)
end
webhook(id, 'start', url, events)
return S_RUNNING
