-- FINISH: the job library's KEYS and ARGV[1..7] (library.lua), then
-- ARGV[8] job id, ARGV[9] terminal status, ARGV[10] hash fields (JSON object),
-- ARGV[11] final event (JSON without seq), ARGV[12] the seq the final event must get
-- (-1: any; the job's worker passes its count of events, so a log that lost some of them is
-- never closed), ARGV[13] '1' when ARGV[14] is the job's whole text, stored when this call
-- ends it (EMIT writes none: its worker holds it), else '0'; ARGV[15] the worker ending it
-- ('' for none: the API): a running job another worker runs now (a continuation took it over
-- from this one, which was thought dead) is left alone, 0; ARGV[16..] the events its
-- worker has not had applied yet, pairs of seq and event (JSON without seq): appended first,
-- each only at the log's next seq, as EMIT would (a resend is skipped, a gap refused), and
-- published where the job's other events are (its reader's channel, all in one message, else
-- its own), so a job's last chunk needs no EMIT call of its own (the token
-- plane on this Redis only). Returns 1 if this call ended the job (or a resend of it finds
-- the job ended so: that status, its final event at that seq), 0 if it was already terminal
-- otherwise or is unknown, -1 if the job still runs and its log lacks events below that seq.
-- On a token plane of its own the worker closes the job's log and stores its text there
-- first (CLOSE, which checks the seq): it passes -1, no text, no events and an empty final
-- event (a resend then finds the job in that status: 1).
-- A worker's FINISH with a seq (the token plane on this Redis) leaves a queued job queued
-- and returns -2: its worker started it on an old primary, whose writes a failover
-- discarded; it gives the job back.

-- Append the carried events from the log's next seq `seq` on and publish them where the
-- job's `reader` (false: none) listens; returns the seq after them, or nil when the first one
-- not yet logged is past `seq` (the log lost events before it).
local function append_carried(id, seq, reader)
  local log, lines = key(T_LOG, id), {}
  local channel = not reader and key(T_CHAN, id) or nil  -- else batched into `lines`
  for i = 16, #ARGV, 2 do
    local event_seq = tonumber(ARGV[i])
    if event_seq > seq then
      return nil
    elseif event_seq == seq then
      local payload = log_append(log, channel, LOG_MAXLEN, 'PUBLISH', ARGV[i + 1], seq)
      if not channel then
        lines[#lines + 1] = id
        lines[#lines + 1] = payload
      end
      seq = seq + 1
    end
  end
  if #lines > 0 then
    redis.call('PUBLISH', key(T_READER, reader), table.concat(lines, '\n'))
  end
  return seq
end

local id, status, expected = ARGV[8], ARGV[9], tonumber(ARGV[12])
local reads = finish_reads(id)
local current, seq = reads[1], nil
if ARGV[15] ~= '' and current == S_RUNNING and reads[6] ~= ARGV[15] then
  return 0
end
if expected >= 0 then
  seq = next_seq(id)
  if current == S_QUEUED then
    return -2
  end
  if current == S_RUNNING then
    seq = append_carried(id, seq, reads[5])
    if not seq or seq < expected then
      return -1
    end
  end
  if current == status and seq == expected + 1 then
    return 1
  end
elseif ARGV[11] == '' and current == status then
  return 1
end
local done = finish(id, status, cjson.decode(ARGV[10]), ARGV[11], reads, seq)
if done and ARGV[13] == '1' then
  redis.call('SET', key(T_TEXT, id), ARGV[14], 'EX', RESULT_TTL)
end
return done and 1 or 0
