-- EMIT: the job library's KEYS and ARGV[1..26] (library.lua), then
-- ARGV[27..] quadruples: job id, seq, event (JSON without seq), text to append to the job's
-- text. The running job's worker numbers its events; an event is applied only when its seq
-- is the job's next (F_NEXT_SEQ): a resend of an applied one is a no-op, and a gap (the log
-- lost events, e.g. Redis restarted from an AOF without its last second) is refused, with
-- the seq the worker must resend from. Events of jobs no longer running are dropped.
-- Returns {ids of jobs asked to stop (a cancel is also announced on the cancel channel, but
-- a worker between pub/sub connections misses it: it still stops the job here), ids of jobs
-- no longer running, {id, next seq} flattened for jobs whose log has a gap}.
local cancelled, gone, behind, refused, flagged = {}, {}, {}, {}, {}
for i = 27, #ARGV, 4 do
  local id = ARGV[i]
  if not refused[id] then
    local h = key(T_HASH, id)
    local status, cancelling, next_seq = unpack(redis.call('HMGET', h, F_STATUS,
      F_CANCEL_REQUESTED, F_NEXT_SEQ))
    local seq = tonumber(ARGV[i + 1])
    if status ~= S_RUNNING then
      refused[id] = true
      table.insert(gone, id)
    elseif seq > tonumber(next_seq) then
      refused[id] = true
      table.insert(behind, id)
      table.insert(behind, tonumber(next_seq))
    else
      if seq == tonumber(next_seq) then
        redis.call('HSET', h, F_NEXT_SEQ, seq + 1)
        append(id, seq, ARGV[i + 2])
        if ARGV[i + 3] ~= '' then
          redis.call('APPEND', key(T_TEXT, id), ARGV[i + 3])
        end
      end
      if cancelling and not flagged[id] then
        flagged[id] = true
        table.insert(cancelled, id)
      end
    end
  end
end
return {cancelled, gone, behind}
