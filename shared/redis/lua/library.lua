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
-- event} (`shared.errors`), decoded only by a script that ends a job with one.
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
-- set, webhook URL, webhook events, reader}; a caller that read them passes them to `finish`.
local function finish_reads(id)
  return redis.call('HMGET', key(T_HASH, id), F_STATUS, F_OWNER_JOBS, F_WEBHOOK,
    F_WEBHOOK_EVENTS, F_READER)
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

local function reap(now, max)
  local expired = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, max)
  local lost = {}
  for _, id in ipairs(expired) do
    local current = redis.call('HGET', key(T_HASH, id), F_STATUS)
    if current == S_RUNNING then
      fail(id, S_FAILED, 'lease_expired')
      table.insert(lost, id)
    elseif current == S_QUEUED then
      fail(id, S_EXPIRED, 'queue_wait_expired')
    end
    redis.call('ZREM', LEASES, id)
  end
  return lost
end
