-- The token plane's library: a job's event log and channel. Prepended to the token-plane
-- scripts (EMIT, OPEN, CLOSE), which declare every key they touch in KEYS, so the token plane
-- may be a Redis Cluster, and to the job library, which uses it when one Redis serves both
-- planes. Binds nothing from KEYS or ARGV: each script passes the keys, the log's MAXLEN and
-- the publish command (PUBLISH, or SPUBLISH on a cluster) to these functions.
-- A log's entries have the ids `1-<seq>`; closing it moves its last id to CLOSED_LOG_ID, so
-- an XADD of any later `1-*` entry is refused.
local CLOSED_LOG_ID = '2-0'

-- The seq of the job's next event: its log's entry ids are `1-<seq>` (0 when it has none).
-- EMIT (emit.lua) keeps the last entry's id the log's last id: it undoes an XADD it refuses.
local function log_next_seq(log)
  local last = redis.call('XREVRANGE', log, '+', '-', 'COUNT', 1)[1]
  return last and tonumber(string.sub(last[1], 3)) + 1 or 0
end

-- The event JSON (without seq) as the log holds it: with its seq (a number or its text) first.
local function log_payload(seq, event)
  return '{"seq":' .. seq .. ',' .. string.sub(event, 2)
end

-- Append `event` to the log (created if absent) as its next event and publish it on
-- `channel` (nil: the caller publishes it); `seq` is the log's next seq where the caller
-- read it (else nil). Returns the payload, as the log holds it.
local function log_append(log, channel, maxlen, publish, event, seq)
  seq = seq or log_next_seq(log)
  local payload = log_payload(seq, event)
  redis.call('XADD', log, 'MAXLEN', '~', maxlen, '1-' .. seq, 'e', payload)
  if channel then
    redis.call(publish, channel, payload)
  end
  return payload
end

-- Append `event` as the log's last event and close the log (`seq` as for `log_append`).
-- Returns the payload, as the log holds it.
local function log_close(log, channel, maxlen, publish, event, seq)
  local payload = log_append(log, channel, maxlen, publish, event, seq)
  redis.call('XSETID', log, CLOSED_LOG_ID)
  return payload
end

-- Whether the log is closed (an absent log is not).
local function log_closed(log)
  if redis.call('EXISTS', log) == 0 then
    return false
  end
  local info = redis.call('XINFO', 'STREAM', log)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      return info[i + 1] == CLOSED_LOG_ID
    end
  end
  return false
end
