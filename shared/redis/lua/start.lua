-- START: the job library's KEYS and ARGV[1..7] (library.lua), then
-- ARGV[8] job id, ARGV[9] worker name, ARGV[10] lease TTL (ms), ARGV[11] Started event,
-- then, for a prompt of whole blocks (`shared.redis.placement`), ARGV[12] the model's prefix
-- index key with `{id}` for the epoch, ARGV[13] an epoch's length (ms), ARGV[14] the index's
-- TTL (s), ARGV[15..] the prompt's block hashes as index fields: a job that starts here
-- records this worker as the holder of its blocks in the current epoch's index.
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
-- A continuation (the job hash has an `attempt`: the reaper put it back in its queue, which
-- happens only where one Redis holds both planes) gets its Started event with that attempt
-- (no queue wait, no `start` webhook: its client saw one already) at the log's next seq, the
-- seam (kept in the hash for a resend), and the reply {running, attempt, the events of its
-- log from seq 1 to the seam, as the log holds them}: the delivered tokens, read in the
-- same script that fences the job's earlier worker out (docs/operations/failure-behaviour.md).
local id = ARGV[8]
local h = key(T_HASH, id)
local current, worker, url, events, created, reader, attempt, seam = unpack(redis.call('HMGET',
  h, F_STATUS, F_WORKER, F_WEBHOOK, F_WEBHOOK_EVENTS, F_CREATED_AT, F_READER, F_ATTEMPT,
  F_SEAM_SEQ))

-- A continuation's reply: {running, its attempt, the log's events from seq 1 up to its
-- Started event at `seam`, as the log holds them}.
local function continuation(at)
  local reply = {S_RUNNING, tonumber(attempt)}
  for _, entry in ipairs(redis.call('XRANGE', key(T_LOG, id), '1-1', '1-' .. (at - 1))) do
    reply[#reply + 1] = entry[2][2]
  end
  return reply
end

if current == S_RUNNING then
  if worker ~= ARGV[9] then
    return false
  end
  return seam and continuation(tonumber(seam)) or S_RUNNING
end
if current ~= S_QUEUED then
  return current
end
local now, stamp = now_ms()

-- Record this worker in the prefix index as the holder of the prompt's blocks.
local function index_prefix()
  if #ARGV < 15 then
    return
  end
  local index = string.gsub(ARGV[12], '{id}', math.floor(now / tonumber(ARGV[13])))
  local fields = {}
  for i = 15, #ARGV do
    fields[#fields + 1] = ARGV[i]
    fields[#fields + 1] = ARGV[9]
  end
  redis.call('HSET', index, unpack(fields))
  redis.call('EXPIRE', index, ARGV[14])
end

local expiry = redis.call('ZSCORE', LEASES, id)
if (not expiry) or tonumber(expiry) <= now then
  fail(id, S_EXPIRED, 'queue_wait_expired')
  return S_EXPIRED
end
redis.call('HSET', h, F_STATUS, S_RUNNING, F_STARTED_AT, stamp, F_WORKER, ARGV[9])
redis.call('ZADD', LEASES, now + tonumber(ARGV[10]), id)
index_prefix()
if attempt then  -- a continuation: the reaper requeued it (library.lua, `continue_job`)
  seam = next_seq(id)
  redis.call('HSET', h, F_SEAM_SEQ, seam)
  emit(id, reader, string.sub(ARGV[11], 1, -2) .. ',"attempt":' .. attempt .. '}')
  return continuation(seam)
end
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
