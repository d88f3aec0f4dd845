-- CLOSE (after plane.lua), on a token plane of its own: KEYS[1] the job's event log,
-- KEYS[2] its channel, KEYS[3] its text; ARGV[1] event log MAXLEN (approximate), ARGV[2] the
-- publish command, ARGV[3] result TTL in seconds, ARGV[4] the final event (JSON without seq),
-- ARGV[5] the seq it must get (-1: any), ARGV[6] (optional) the job's whole text.
-- Appends the final event, closes the log, puts it and the text on their TTL. Its worker's
-- FINISH runs this first, with its count of events as the seq and its text, then ends the job
-- on the control Redis; a job ended there by anyone else has its final event appended here
-- from the outbox (`shared.redis.token_plane`), with any seq. Returns 1 if this call closed the log
-- (or a resend finds it closed with this final event at that seq), 0 if it was closed
-- already otherwise, -1 if the log lacks events below that seq.
local log, expected = KEYS[1], tonumber(ARGV[5])
local next = log_next_seq(log)
if log_closed(log) then
  if expected >= 0 and next == expected + 1 then
    local last = redis.call('XREVRANGE', log, '+', '-', 'COUNT', 1)[1]
    if last[2][2] == log_payload(expected, ARGV[4]) then
      return 1
    end
  end
  return 0
end
if expected >= 0 and next < expected then
  return -1
end
log_close(log, KEYS[2], ARGV[1], ARGV[2], ARGV[4])
local ttl = tonumber(ARGV[3])
redis.call('EXPIRE', log, ttl)
if ARGV[6] then
  redis.call('SET', KEYS[3], ARGV[6], 'EX', ttl)
end
return 1
