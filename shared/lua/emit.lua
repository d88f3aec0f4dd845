-- EMIT (after plane.lua), on the token plane: KEYS[2k - 1], KEYS[2k] the event log and the
-- channel of the k-th event's job; ARGV[1] event log MAXLEN (approximate), ARGV[2] the publish
-- command (PUBLISH; SPUBLISH on a cluster, where a call carries the events of one job only),
-- ARGV[3] the number n of reader channels that follow, ARGV[4..3 + n] those channels (a plain
-- Redis only), then triples: job id, seq, event (JSON as the log holds it, seq first: built by
-- `shared.scripts.emit`, so Redis does no string work per event). An event whose channel is a
-- reader channel (the API process that reads its job: `keys.reader_channel`) is published
-- there, with the call's other events for that reader, as one message of lines: each
-- event's job id, then the event: one PUBLISH per reader and call, not one per event (and no
-- string built per event). The running job's worker
-- numbers its events; the job's log numbers its entries `1-<seq>` (plane.lua), so an event is
-- appended with the id `1-*`, which the stream numbers as its next seq, and is kept only when
-- that is the worker's seq: a resend of an applied one is a no-op, and a gap (the log lost
-- events, e.g. Redis restarted from an AOF without its last second) is refused, with the seq
-- the worker must resend from; either undoes the XADD (rare). Events of jobs no longer
-- running are dropped: an ended job's log is closed (CLOSE, or the job library's `finish`),
-- which refuses the XADD, and a job that never started has no log (NOMKSTREAM). An applied
-- event costs XADD and PUBLISH; the job's hash is not read, and its text is written whole by
-- FINISH (readers of a running job join the texts of its log: `api.job_record`). A cancel that
-- a worker between pub/sub connections missed is found by RENEW. Per event, cheap: the XADD
-- carries MAXLEN only once its seq reaches it (a log of seqs up to `seq` cannot be longer;
-- the trim check cost about as much as the append), and the seq is checked against the
-- entry's id as the text it came as (Lua formats numbers slowly).
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

local maxlen, publish, readers = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local batched = {}  -- reader channel: its lines
for i = 4, 3 + readers do
  batched[ARGV[i]] = {}
end
local first = 4 + readers
for i = first, #ARGV, 3 do
  local id, seq_text = ARGV[i], ARGV[i + 1]
  local seq = tonumber(seq_text)
  local log, channel = KEYS[(i - first) / 3 * 2 + 1], KEYS[(i - first) / 3 * 2 + 2]
  if not refused[id] and not (expect[id] and seq < expect[id]) then  -- not a known resend
    local payload = ARGV[i + 2]
    local added
    if seq < maxlen then  -- entries `1-0` to `1-<seq>` at most: nothing to trim
      added = redis.pcall('XADD', log, 'NOMKSTREAM', '1-*', 'e', payload)
    else
      added = redis.pcall('XADD', log, 'NOMKSTREAM', 'MAXLEN', '~', maxlen, '1-*', 'e', payload)
    end
    if type(added) ~= 'string' then  -- no log, or a closed one
      refused[id] = true
      table.insert(gone, id)
    elseif added == '1-' .. seq_text then
      local lines = batched[channel]
      if lines then
        lines[#lines + 1] = id
        lines[#lines + 1] = payload
      else
        redis.call(publish, channel, payload)
      end
    else
      local next_seq = tonumber(string.sub(added, 3))
      redis.call('XDEL', log, added)
      rewind(log, '1-' .. (next_seq - 1))
      expect[id] = next_seq
      if seq > next_seq then
        refused[id] = true
        table.insert(behind, id)
        table.insert(behind, next_seq)
      end
    end
  end
end
for channel, lines in pairs(batched) do
  if #lines > 0 then
    redis.call(publish, channel, table.concat(lines, '\n'))
  end
end
return {gone, behind}
