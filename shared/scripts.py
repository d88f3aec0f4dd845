"""Lua scripts over the lease set and the job keys, with typed wrappers.

Every script that may end a job shares one Lua library (`_LIBRARY`): `emit` assigns the
next `seq`, appends the event to the job's replay log and publishes it; `finish` moves a
job to a terminal state exactly once (a job already terminal is left alone), emits its
final event, releases its lease and puts the result keys on their TTL; `reap` ends jobs
whose lease expired; `webhook` queues a webhook delivery when a job that asked for one
(hash fields `webhook`, `webhook_events`) starts (`start`, in START) or ends (`completed`,
in `finish`), in the same script as the transition, so none is lost or made twice; the
dispatchers in `api.webhooks` send them. Time comes from Redis (`TIME`), so the clocks of
API nodes and workers never matter.

Common arguments of the library scripts:
    KEYS[1]  the lease set (`shared.keys.leases()`)
    KEYS[#KEYS]  the webhook delivery list (`shared.keys.webhook_deliveries()`), always last
    ARGV[1..4]  key templates: job hash, event log, channel, text (`JOB_KEY_TEMPLATES`)
    ARGV[5]  event log MAXLEN (approximate)
    ARGV[6]  result TTL in seconds
Script-specific arguments start at ARGV[7]; each script's header lists them.

The wrappers build a `ScriptCall`; the async API and the sync worker each run it on their
own client (`api.redis_scripts`, `worker.redis_scripts`) and parse the reply here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared import keys
from shared.errors import Overloaded, QuotaExceeded
from shared.settings import Settings

_LIBRARY = r"""
local LEASES = KEYS[1]
local WEBHOOK_DELIVERIES = KEYS[#KEYS]
local T_HASH, T_LOG, T_CHAN, T_TEXT = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local LOG_MAXLEN = ARGV[5]
local RESULT_TTL = tonumber(ARGV[6])
local TERMINAL = {succeeded = true, failed = true, cancelled = true, expired = true}

local function key(template, id)
  return (string.gsub(template, '{id}', id))
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function now_s_text()
  local t = redis.call('TIME')
  return t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end

local function emit(id, event)
  local seq = redis.call('HINCRBY', key(T_HASH, id), 'next_seq', 1) - 1
  local payload = '{"seq":' .. seq .. ',' .. string.sub(event, 2)
  redis.call('XADD', key(T_LOG, id), 'MAXLEN', '~', LOG_MAXLEN, '1-' .. seq, 'e', payload)
  redis.call('PUBLISH', key(T_CHAN, id), payload)
  return seq
end

-- Queue a webhook delivery of `event` ('start' or 'completed') if the job's filter has it.
local function webhook(id, event)
  local hook = redis.call('HMGET', key(T_HASH, id), 'webhook', 'webhook_events')
  if hook[1] and string.find(',' .. (hook[2] or '') .. ',', ',' .. event .. ',', 1, true) then
    redis.call('LPUSH', WEBHOOK_DELIVERIES, cjson.encode({job_id = id, event = event, attempt = 0}))
  end
end

local function finish(id, status, fields, event)
  local h = key(T_HASH, id)
  local current = redis.call('HGET', h, 'status')
  if (not current) or TERMINAL[current] then
    return false
  end
  redis.call('HSET', h, 'status', status, 'finished_at', now_s_text())
  for field, value in pairs(fields) do
    redis.call('HSET', h, field, tostring(value))
  end
  emit(id, event)
  webhook(id, 'completed')
  redis.call('ZREM', LEASES, id)
  local owner_jobs = redis.call('HGET', h, 'owner_jobs')
  if owner_jobs then
    redis.call('SREM', owner_jobs, id)
  end
  redis.call('EXPIRE', h, RESULT_TTL)
  redis.call('EXPIRE', key(T_LOG, id), RESULT_TTL)
  redis.call('EXPIRE', key(T_TEXT, id), RESULT_TTL)
  return true
end

local function fail(id, status, error_type, message)
  return finish(id, status, {error_type = error_type, error_message = message},
    cjson.encode({type = 'error', error_type = error_type, message = message}))
end

local function reap(now, max)
  local expired = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, max)
  local lost = {}
  for _, id in ipairs(expired) do
    local current = redis.call('HGET', key(T_HASH, id), 'status')
    if current == 'running' then
      fail(id, 'failed', 'worker_lost',
        'the worker running this job stopped renewing its lease (it died or lost Redis)')
      table.insert(lost, id)
    elseif current == 'queued' then
      fail(id, 'expired', 'expired',
        'the job was not started within the allowed queue wait; retry later')
    end
    redis.call('ZREM', LEASES, id)
  end
  return lost
end
"""

_REAP_BATCH = 100
RECENT_JOBS_KEPT = 50

ADMIT = (
    _LIBRARY
    + r"""
-- KEYS[2] recent job ids (list, newest first), KEYS[3] rejection counts (hash),
-- KEYS[4] the owner's unfinished job ids (set).
-- ARGV[7] job id, ARGV[8] limit, ARGV[9] queued lease (ms), ARGV[10] owner, ARGV[11] model,
-- ARGV[12] the most expired leases to reap first, ARGV[13] how many recent job ids to keep,
-- ARGV[14] the error type a refusal is counted under, ARGV[15] the owner's own limit
-- (0: none), ARGV[16] the error type an owner's refusal is counted under.
-- Returns {1, in_flight} when admitted, {0, in_flight} when the global limit is reached,
-- {-1, owner_in_flight} when the owner's limit is; each followed by the ids of running jobs
-- the reaping failed as `worker_lost` (their RQ registries still call them started).
local id, limit, lease_ms = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
local now = now_ms()
local lost = reap(now, tonumber(ARGV[12]))
local owner_limit = tonumber(ARGV[15])
if owner_limit > 0 then
  local owner_in_flight = redis.call('SCARD', KEYS[4])
  if owner_in_flight >= owner_limit then
    redis.call('HINCRBY', KEYS[3], ARGV[16], 1)
    return {-1, owner_in_flight, unpack(lost)}
  end
end
local in_flight = redis.call('ZCARD', LEASES)
if in_flight >= limit then
  redis.call('HINCRBY', KEYS[3], ARGV[14], 1)
  return {0, in_flight, unpack(lost)}
end
redis.call('ZADD', LEASES, now + lease_ms, id)
redis.call('SADD', KEYS[4], id)
redis.call('HSET', key(T_HASH, id), 'status', 'queued', 'owner', ARGV[10], 'model', ARGV[11],
  'created_at', now_s_text(), 'next_seq', 0, 'owner_jobs', KEYS[4])
redis.call('LPUSH', KEYS[2], id)
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[13]) - 1)
return {1, in_flight + 1, unpack(lost)}
"""
)

START = (
    _LIBRARY
    + r"""
-- ARGV[7] job id, ARGV[8] worker name, ARGV[9] lease TTL (ms), ARGV[10] Started event
-- Returns 'running' when this worker now owns the job, else the status that stops it
-- ('expired' when its queue wait ran out, or the terminal status it already has);
-- false when the job is unknown. Queues the job's `start` webhook delivery, if it has one.
local id = ARGV[7]
local h = key(T_HASH, id)
local current = redis.call('HGET', h, 'status')
if current ~= 'queued' then
  return current
end
local now = now_ms()
local expiry = redis.call('ZSCORE', LEASES, id)
if (not expiry) or tonumber(expiry) <= now then
  fail(id, 'expired', 'expired',
    'the job was not started within the allowed queue wait; retry later')
  return 'expired'
end
redis.call('HSET', h, 'status', 'running', 'started_at', now_s_text(), 'worker', ARGV[8])
redis.call('ZADD', LEASES, now + tonumber(ARGV[9]), id)
emit(id, ARGV[10])
webhook(id, 'start')
return 'running'
"""
)

EMIT = (
    _LIBRARY
    + r"""
-- ARGV[7..] triples: job id, event (JSON without seq), text to append to the job's text.
-- Events of jobs no longer running are dropped. Returns the ids of the jobs to stop: those
-- no longer running, and those asked to stop (a cancel is also announced on the cancel
-- channel, but a worker between pub/sub connections misses it: it still stops the job here).
local stopped = {}
for i = 7, #ARGV, 3 do
  local id = ARGV[i]
  local status, cancelling = unpack(redis.call('HMGET', key(T_HASH, id), 'status',
    'cancel_requested'))
  if status == 'running' then
    emit(id, ARGV[i + 1])
    if ARGV[i + 2] ~= '' then
      redis.call('APPEND', key(T_TEXT, id), ARGV[i + 2])
    end
  end
  if status ~= 'running' or cancelling then
    table.insert(stopped, id)
  end
end
return stopped
"""
)

FINISH = (
    _LIBRARY
    + r"""
-- ARGV[7] job id, ARGV[8] terminal status, ARGV[9] hash fields (JSON object),
-- ARGV[10] final event (JSON without seq). Returns 1 if this call ended the job.
local done = finish(ARGV[7], ARGV[8], cjson.decode(ARGV[9]), ARGV[10])
return done and 1 or 0
"""
)

CANCEL = (
    _LIBRARY
    + r"""
-- ARGV[7] job id, ARGV[8] the workers' cancel channel.
-- A queued job ends cancelled at once; a running job is flagged and its worker told.
-- Returns 'cancelled', 'cancelling', the terminal status it already had, or false.
local id = ARGV[7]
local h = key(T_HASH, id)
local current = redis.call('HGET', h, 'status')
if current == 'queued' then
  fail(id, 'cancelled', 'cancelled', 'the job was cancelled before it started')
  return 'cancelled'
elseif current == 'running' then
  redis.call('HSET', h, 'cancel_requested', '1')
  redis.call('PUBLISH', ARGV[8], id)
  return 'cancelling'
end
return current
"""
)

REAP = (
    _LIBRARY
    + r"""
-- ARGV[7] the most leases to reap in this call.
-- Returns the ids of the running jobs it failed as `worker_lost` (RQ still shows them started).
return reap(now_ms(), tonumber(ARGV[7]))
"""
)

RENEW = r"""
-- KEYS[1] the lease set; ARGV[1] lease TTL (ms); ARGV[2..] job ids.
-- Extends each unexpired lease; returns the ids whose lease had expired or was gone.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lost = {}
for i = 2, #ARGV do
  local expiry = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if expiry and tonumber(expiry) > now then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
"""

REGISTER_WORKER = r"""
-- KEYS[1] the model index (zset), KEYS[2] this worker's hash.
-- ARGV[1] model, ARGV[2] capacity (jobs at once), ARGV[3] heartbeat TTL (ms).
-- Records the worker and marks its model live until the heartbeat expires.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[2], 'model', ARGV[1], 'capacity', ARGV[2], 'heartbeat_ms', now)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[1], 'GT', now + ttl, ARGV[1])
return now + ttl
"""

LIVE_MODELS = r"""
-- KEYS[1] the model index. Returns {models with a live worker, every model ever served}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
return {live, redis.call('ZRANGE', KEYS[1], 0, -1)}
"""

Arg = str | int | float


@dataclass(frozen=True)
class ScriptCall:
    """One script invocation, ready for a sync or async Redis client."""

    source: str
    keys: list[str]
    args: list[Arg]


def _library_call(
    source: str, settings: Settings, *args: Arg, extra_keys: tuple[str, ...] = ()
) -> ScriptCall:
    header: list[Arg] = [*keys.JOB_KEY_TEMPLATES, settings.event_log_maxlen, settings.result_ttl_s]
    library_keys = [keys.leases(), *extra_keys, keys.webhook_deliveries()]
    return ScriptCall(source, library_keys, [*header, *args])


def admit(
    settings: Settings, job_id: str, owner: str, model: str, owner_limit: int | None = None
) -> ScriptCall:
    return _library_call(
        ADMIT,
        settings,
        job_id,
        settings.max_inflight,
        settings.max_queue_wait_ms,
        owner,
        model,
        _REAP_BATCH,
        RECENT_JOBS_KEPT,
        Overloaded.error_type,
        owner_limit or 0,
        QuotaExceeded.error_type,
        extra_keys=(keys.recent_jobs(), keys.rejections(), keys.owner_jobs(owner)),
    )


def reaped_by_admission(reply: list[Any]) -> list[str]:
    """Running jobs an ADMIT call failed as `worker_lost` on its way (see `reap`)."""
    return [str(job_id) for job_id in reply[2:]]


def check_admitted(reply: list[Any]) -> int:
    """The in-flight count after admission; raises `QuotaExceeded` when the caller's own
    limit is reached, `Overloaded` when the global one is."""
    admitted, in_flight = int(reply[0]), int(reply[1])
    if admitted < 0:
        raise QuotaExceeded(
            f"this API key already has {in_flight} requests in flight, its limit; retry when "
            "one finishes",
            retry_after_s=1,
        )
    if not admitted:
        raise Overloaded(
            f"tokenrelay is at capacity ({in_flight} requests in flight); retry shortly",
            retry_after_s=1,
        )
    return in_flight


def start(settings: Settings, job_id: str, worker: str, started_event: str) -> ScriptCall:
    return _library_call(START, settings, job_id, worker, settings.lease_ttl_ms, started_event)


def emit(settings: Settings, events: list[tuple[str, str, str]]) -> ScriptCall:
    """Append events of several jobs in one round trip: (job id, event JSON, text delta)."""
    flat: list[Arg] = [part for triple in events for part in triple]
    return _library_call(EMIT, settings, *flat)


def finish(
    settings: Settings, job_id: str, status: str, fields: dict[str, Arg], final_event: str
) -> ScriptCall:
    return _library_call(FINISH, settings, job_id, status, json.dumps(fields), final_event)


def cancel(settings: Settings, job_id: str) -> ScriptCall:
    return _library_call(CANCEL, settings, job_id, keys.cancel_channel())


def reap(settings: Settings) -> ScriptCall:
    return _library_call(REAP, settings, _REAP_BATCH)


def renew(settings: Settings, job_ids: list[str]) -> ScriptCall:
    return ScriptCall(RENEW, [keys.leases()], [settings.lease_ttl_ms, *job_ids])


def decode_text(value: bytes | str | None) -> str | None:
    """Script replies arrive as bytes on clients without `decode_responses`."""
    if isinstance(value, bytes):
        return value.decode()
    return value


def register_worker(settings: Settings, name: str, model: str, capacity: int) -> ScriptCall:
    ttl_ms = settings.lease_ttl_ms
    script_keys = [keys.models(), keys.worker(name)]
    return ScriptCall(REGISTER_WORKER, script_keys, [model, capacity, ttl_ms])


def live_models() -> ScriptCall:
    return ScriptCall(LIVE_MODELS, [keys.models()], [])
