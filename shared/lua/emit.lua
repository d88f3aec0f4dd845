-- EMIT: the job library's KEYS and ARGV[1..26] (library.lua), then
-- ARGV[27..] triples: job id, event (JSON without seq), text to append to the job's text.
-- Events of jobs no longer running are dropped. Returns the ids of the jobs to stop: those
-- no longer running, and those asked to stop (a cancel is also announced on the cancel
-- channel, but a worker between pub/sub connections misses it: it still stops the job here).
local stopped = {}
for i = 27, #ARGV, 3 do
  local id = ARGV[i]
  local status, cancelling = unpack(redis.call('HMGET', key(T_HASH, id), F_STATUS,
    F_CANCEL_REQUESTED))
  if status == S_RUNNING then
    emit(id, ARGV[i + 1])
    if ARGV[i + 2] ~= '' then
      redis.call('APPEND', key(T_TEXT, id), ARGV[i + 2])
    end
  end
  if status ~= S_RUNNING or cancelling then
    table.insert(stopped, id)
  end
end
return stopped
