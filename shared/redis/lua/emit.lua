-- HOT PATH (docs/architecture.md): measure with `python -m bench.probes.redis_emit`.
-- EMIT (after plane.lua), on the token plane. Its events come in groups, one per channel
-- they are published on: ARGV[1] event log MAXLEN (approximate), or '' when no event of the
-- call reaches it, ARGV[2] the publish command (PUBLISH; SPUBLISH on a cluster, where a call
-- carries the events of one job only), ARGV[3] the number of groups, then each group: a
-- reader channel (the API process that reads its jobs: `keys.reader_channel`; a plain Redis
-- only), or '' for events published on their jobs' own channels, the number of its events,
-- then per event: job id, the event's entry id `1-<seq>`, event (JSON as the log holds it,
-- seq first). KEYS: each event's job's event log, in that order, followed by the job's
-- channel for an event of the '' group. All of it is built by `shared.redis.plane_scripts.emit`, so
-- Redis does no string or number work per event. A reader's events are published on its
-- channel as one message of lines (each event's job id, then the event): one PUBLISH per
-- reader and call, not one per event.
-- The running job's worker numbers its events; the job's log numbers its entries `1-<seq>`
-- (plane.lua), so an event is appended with the id `1-*`, which the stream numbers as its
-- next seq, and is kept only when that is the event's entry id: a resend of an applied one
-- is a no-op, and a gap (the log lost events, e.g. Redis restarted from an AOF without its
-- last second) is refused, with the seq the worker must resend from; either undoes the XADD
-- (rare). Events of jobs no longer running are dropped: an ended job's log is closed
-- (CLOSE, or the job library's `finish`), which refuses the XADD, and a job that never
-- started has no log (NOMKSTREAM). An applied event costs XADD and PUBLISH; the job's hash
-- is not read, and its text is written whole by FINISH (readers of a running job join the
-- texts of its log: `api.jobs.record`). A cancel that a worker between pub/sub connections
-- missed is found by RENEW. Per event, cheap: the XADD carries MAXLEN only once its seq
-- reaches it (a log of seqs up to `seq` cannot be longer; the trim check cost about as much
-- as the append), and an event's seq is read as a number only on the rare paths (a resend,
-- a gap, a call that carries MAXLEN): the common one compares the XADD's id with the
-- event's, as strings (Lua makes numbers of strings, and strings of numbers, slowly).
-- A resend is compared with what the log holds at its seq (the rare path): a different
-- event there means the job was continued by another worker (its Started event took the
-- seq this worker's next event meant to take: docs/operations/failure-behaviour.md), so
-- this worker's events are dropped and the job is reported no longer running here.
-- Returns {ids of jobs no longer running, {id, next seq} flattened for jobs whose log has a
-- gap}.
local gone, behind, refused, expect = {}, {}, {}, {}

-- Make `last` the log's last id again, after an XADD it refused was XDELed. Valkey refuses
-- an XSETID below the stream's max deleted id: there the log is rebuilt without that entry.
local function rewind(log, last)
  local set = redis.pcall('XSETID', log, last)
  if type(set) == 'table' and set.err then
    local entries = redis.call('XRANGE', log, '-', '+')
    redis.call('DEL', log)
    for _, entry in ipairs(entries) do
      redis.call('XADD', log, entry[1], unpack(entry[2]))
    end
  end
end

-- The seq of the entry id `1-<seq>`.
local function seq_of(entry)
  return tonumber(string.sub(entry, 3))
end

local maxlen, publish = tonumber(ARGV[1]), ARGV[2]

-- Whether the log holds another event than `payload` at `entry` (a trimmed one: not known).
local function superseded(log, entry, payload)
  local stored = redis.call('XRANGE', log, entry, entry)[1]
  return stored ~= nil and stored[2][2] ~= payload
end

-- Drop the job's events in this call and report it no longer running here.
local function refuse(id)
  refused[id] = true
  table.insert(gone, id)
end

-- Append the event to the job's log as its next one; whether it was (else it was dropped).
local function append(log, id, entry, payload)
  if refused[id] then
    return false
  end
  if expect[id] and seq_of(entry) < expect[id] then  -- a known resend
    if superseded(log, entry, payload) then
      refuse(id)
    end
    return false
  end
  local added
  if not (maxlen and seq_of(entry) >= maxlen) then  -- entries `1-0` to `1-<seq>` at most
    added = redis.pcall('XADD', log, 'NOMKSTREAM', '1-*', 'e', payload)
  else
    added = redis.pcall('XADD', log, 'NOMKSTREAM', 'MAXLEN', '~', maxlen, '1-*', 'e', payload)
  end
  if added == entry then
    return true
  end
  if type(added) ~= 'string' then  -- no log, or a closed one
    refuse(id)
    return false
  end
  local next_seq = seq_of(added)
  redis.call('XDEL', log, added)
  rewind(log, '1-' .. (next_seq - 1))
  expect[id] = next_seq
  if seq_of(entry) > next_seq then
    refused[id] = true
    table.insert(behind, id)
    table.insert(behind, next_seq)
  elseif superseded(log, entry, payload) then
    refuse(id)
  end
  return false
end

local i, k = 4, 0  -- the next ARGV index, the last KEYS index used
for _ = 1, tonumber(ARGV[3]) do
  local reader, count = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  local lines = {}
  for _ = 1, count do
    local id, entry, payload = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    i = i + 3
    k = k + 1
    local log = KEYS[k]
    if reader == '' then
      k = k + 1
      if append(log, id, entry, payload) then
        redis.call(publish, KEYS[k], payload)
      end
    elseif append(log, id, entry, payload) then
      lines[#lines + 1] = id
      lines[#lines + 1] = payload
    end
  end
  if #lines > 0 then
    redis.call(publish, reader, table.concat(lines, '\n'))
  end
end
return {gone, behind}
