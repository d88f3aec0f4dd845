-- HANDOVER: the job library's KEYS and ARGV[1..7] (library.lua), then
-- ARGV[8] job id, ARGV[9] the worker handing it over.
-- A worker told to stop whose drain period ran out hands each job it still runs back to the
-- front of its queue as a continuation (`continue_job`), once Redis holds every event it
-- generated: only while it runs the job and the job has attempts left. Returns 1 if it did,
-- else 0 (the worker then ends the job as before).
local id = ARGV[8]
local current, worker = unpack(redis.call('HMGET', key(T_HASH, id), F_STATUS, F_WORKER))
if current ~= S_RUNNING or worker ~= ARGV[9] then
  return 0
end
return continue_job(id, now_ms()) and 1 or 0
