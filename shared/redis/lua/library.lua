-- The job library, prepended (after clock.lua and plane.lua) to every script that may end a
-- job.
-- KEYS[1]  the lease set (`keys.leases()`)
-- KEYS[#KEYS - 1]  the token plane's outbox (`keys.token_plane_outbox()`)
-- KEYS[#KEYS]  the webhook delivery list (`keys.webhook_deliveries()`), always last
-- ARGV[1..5]  key templates: job hash, event log, channel, text (`keys.JOB_KEY_TEMPLATES`),
--             and a reader's channel (`keys.READER_CHANNEL_TEMPLATE`); the last four are
--             empty when the token plane is a Redis of its own: then a job's events are its
--             worker's to append there (START and FINISH leave them to it), and a job ended
--             here by anyone else has its final event queued in the outbox, from which
--             `shared.redis.token_plane` appends it and closes the log
-- ARGV[6]  event log MAXLEN (approximate)
-- ARGV[7]  result TTL in seconds
-- Script-specific arguments start at ARGV[8].
-- Bound before this file, by `shared.redis.scripts` (compiled into every script on the library,
-- not sent with each call): the job hash's field names as F_* (`jobs.JobField`), the job
-- statuses as S_* (`jobs.JobStatus`) and SCRIPT_ERRORS, the errors scripts end jobs with, as
-- JSON: {lease_expired, queue_wait_expired, cancelled_before_start} each {type, message,
-- event} (`shared.errors`), decoded only by a script that ends a job with one; RQ's names a
-- continuation uses (RQ_JOB_PREFIX, RQ_QUEUE_PREFIX, RQ_STARTED_PREFIX, RQ_ORIGIN, RQ_STATUS,
-- RQ_QUEUED) and the
-- cluster's count of continued jobs, MIGRATIONS (`keys.migrations()`).
-- A job with a reader (the API process that admitted it and streams it: the job hash's
-- `reader`) has every event published on that reader's channel, as EMIT publishes its
-- tokens there (lines: the job id, then the event), so its reader needs no subscription of
-- its own per job; a job without one has them on its own channel.
-- Spelled here, not passed in: the event log's entry field `e` (`api.streaming.hub` reads it), the
-- delivery record's keys (`api.webhooks.queue.Delivery`) and the webhook event names `start`
-- and `completed` (`api.webhooks.policy.WEBHOOK_EVENTS`): formats defined above `shared`.
local LEASES = KEYS[1]
local OUTBOX = KEYS[#KEYS - 1]
local WEBHOOK_DELIVERIES = KEYS[#KEYS]
local T_HASH, T_LOG, T_CHAN, T_TEXT, T_READER = unpack(ARGV, 1, 5)
local PLANE_HERE = T_LOG ~= ''
local LOG_MAXLEN = ARGV[6]
local RESULT_TTL = tonumber(ARGV[7])
local script_errors

-- The error `name` of SCRIPT_ERRORS: {type, message, event}.
local function script_error(name)
  script_errors = script_errors or cjson.decode(SCRIPT_ERRORS)
  return script_errors[name]
end

local function key(template, id)
  return (string.gsub(template, '{id}', id))
end

-- The seq of the job's next event (only where PLANE_HERE).
local function next_seq(id)
  return log_next_seq(key(T_LOG, id))
end

-- Publish the job's event `payload` (as its log holds it) where its `reader` (the job hash's
-- field, false when it has none) listens, else on the job's channel.
local function publish_event(id, reader, payload)
  if reader then
    redis.call('PUBLISH', key(T_READER, reader), id .. '\n' .. payload)
  else
    redis.call('PUBLISH', key(T_CHAN, id), payload)
  end
end

-- Append `event` as the job's next event and publish it where its `reader` listens, as
-- `publish_event` does (only where PLANE_HERE).
local function emit(id, reader, event)
  publish_event(id, reader, log_append(key(T_LOG, id), nil, LOG_MAXLEN, 'PUBLISH', event))
end

-- The job hash's fields that ending a job reads, in one HMGET: {status, the owner's job
-- set, webhook URL, webhook events, reader, worker}; a caller that read them passes them to
-- `finish`.
local function finish_reads(id)
  return redis.call('HMGET', key(T_HASH, id), F_STATUS, F_OWNER_JOBS, F_WEBHOOK,
    F_WEBHOOK_EVENTS, F_READER, F_WORKER)
end

-- Queue a webhook delivery of `event` ('start' or 'completed') if the job's webhook `url`
-- and its `events` filter (the job hash's fields, false when absent) have it.
local function webhook(id, event, url, events)
  if url and string.find(',' .. (events or '') .. ',', ',' .. event .. ',', 1, true) then
    redis.call('LPUSH', WEBHOOK_DELIVERIES, cjson.encode({job_id = id, event = event, attempt = 0}))
  end
end

-- End the job with `status`, its hash `fields` and final `event`: '' when the caller closed
-- the job's log on a token plane of its own already (a worker's FINISH). `reads` is the
-- caller's `finish_reads(id)` and `seq` the log's next seq, where it has them (else nil).
local function finish(id, status, fields, event, reads, seq)
  local h = key(T_HASH, id)
  local current, owner_jobs, url, events, reader = unpack(reads or finish_reads(id))
  if current ~= S_QUEUED and current ~= S_RUNNING then  -- unknown, or terminal already
    return false
  end
  local _, stamp = now_ms()
  local hash = {F_STATUS, status, F_FINISHED_AT, stamp}
  for field, value in pairs(fields) do
    table.insert(hash, field)
    table.insert(hash, tostring(value))
  end
  redis.call('HSET', h, unpack(hash))
  if PLANE_HERE then
    publish_event(id, reader, log_close(key(T_LOG, id), nil, LOG_MAXLEN, 'PUBLISH', event, seq))
    -- No text key yet: only the worker's FINISH stores one, after this, with its TTL.
    redis.call('EXPIRE', key(T_LOG, id), RESULT_TTL)
  elseif event ~= '' then
    redis.call('HSET', OUTBOX, id, event)
  end
  webhook(id, 'completed', url, events)
  redis.call('ZREM', LEASES, id)
  if owner_jobs then
    redis.call('SREM', owner_jobs, id)
  end
  redis.call('EXPIRE', h, RESULT_TTL)
  return true
end

-- End the job with `status` and the error named `name` in SCRIPT_ERRORS.
local function fail(id, status, name)
  local err = script_error(name)
  local fields = {[F_ERROR_TYPE] = err.type, [F_ERROR_MESSAGE] = err.message}
  return finish(id, status, fields, err.event)
end

-- Put the running job `id`, whose lease expired at `now`, back at the front of its queue as
-- a continuation, if it has attempts left (`F_MAX_ATTEMPTS`, written by ADMIT; absent: none)
-- and its log still holds every event from seq 0 (trimmed, the delivered tokens' ids are
-- gone): queued again with its next attempt number (the fence: its old worker's RENEW and
-- FINISH name a worker the job no longer has, and its EMIT meets the next worker's events),
-- the dead worker moved to the past workers, a lease for the queue wait, and RQ's record
-- queued at the front of its queue, its earlier executions out of RQ's started registry. Only where one Redis holds both planes (PLANE_HERE):
-- elsewhere a zombie's EMIT could not be fenced in the same script. Whether it did.
local function continue_job(id, now)
  local h = key(T_HASH, id)
  local attempt, max_attempts, requeue_ms, worker, past = unpack(redis.call('HMGET', h,
    F_ATTEMPT, F_MAX_ATTEMPTS, F_REQUEUE_MS, F_WORKER, F_PAST_WORKERS))
  attempt = tonumber(attempt or 1)
  if not (PLANE_HERE and max_attempts and requeue_ms) or attempt >= tonumber(max_attempts) then
    return false
  end
  if #redis.call('XRANGE', key(T_LOG, id), '1-0', '1-0') == 0 then
    return false
  end
  local rq_job = RQ_JOB_PREFIX .. id
  local origin = redis.call('HGET', rq_job, RQ_ORIGIN)
  if not origin then
    return false
  end
  worker = worker or ''
  redis.call('HSET', h, F_STATUS, S_QUEUED, F_ATTEMPT, attempt + 1,
    F_PAST_WORKERS, past and (past .. ',' .. worker) or worker)
  redis.call('HDEL', h, F_WORKER)
  redis.call('ZADD', LEASES, now + tonumber(requeue_ms), id)
  redis.call('HSET', rq_job, RQ_STATUS, RQ_QUEUED)
  redis.call('LPUSH', RQ_QUEUE_PREFIX .. origin, id)
  local started, prefix = RQ_STARTED_PREFIX .. origin, id .. ':'
  for _, member in ipairs(redis.call('ZRANGE', started, 0, -1)) do
    if string.sub(member, 1, #prefix) == prefix then
      redis.call('ZREM', started, member)
    end
  end
  redis.call('INCR', MIGRATIONS)
  return true
end

local function reap(now, max)
  local expired = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, max)
  local lost = {}
  for _, id in ipairs(expired) do
    local current = redis.call('HGET', key(T_HASH, id), F_STATUS)
    if current == S_RUNNING then
      if not continue_job(id, now) then
        fail(id, S_FAILED, 'lease_expired')
        table.insert(lost, id)
        redis.call('ZREM', LEASES, id)
      end
    else
      if current == S_QUEUED then
        fail(id, S_EXPIRED, 'queue_wait_expired')
      end
      redis.call('ZREM', LEASES, id)
    end
  end
  return lost
end
