-- OPEN (after plane.lua), on a token plane of its own: KEYS[1] the job's event log, KEYS[2] its
-- channel; ARGV[1] event log MAXLEN (approximate), ARGV[2] the publish command, ARGV[3] the
-- Started event (JSON without seq). Run by the job's worker once START made it the owner:
-- starts the log with the Started event, seq 0. A resend finds the log there and adds
-- nothing; so does a call for a job ended meanwhile (its log is closed). Returns 1 when this
-- call started the log, else 0.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
log_append(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
return 1
