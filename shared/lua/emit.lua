-- EMIT: the job library's KEYS and ARGV[1..26] (library.lua), then
-- ARGV[27..] triples: job id, seq, event (JSON without seq). The running job's worker numbers its events; an event is applied only when its seq
-- is the job's next (F_NEXT_SEQ): a resend of an applied one is a no-op, and a gap (the log
-- lost events, e.g. Redis restarted from an AOF without its last second) is refused, with
-- the seq the worker must resend from. Events of jobs no longer running are dropped.
-- An applied event costs HINCRBY (it reads and advances F_NEXT_SEQ at once), XADD and
-- PUBLISH; the job's text is not written here but whole by FINISH (readers of a running job
-- join the texts of its log: `api.job_record`). The job's status is not
-- read on this path: a job that ended has a closed log (`finish` in library.lua), which
-- refuses the XADD. Only a seq that is not the next one reads it (and undoes the HINCRBY).
-- A cancel that a worker between pub/sub connections missed is found by RENEW.
-- Returns {ids of jobs no longer running, {id, next seq} flattened for jobs whose log has a
-- gap}.
local gone, behind, refused = {}, {}, {}

-- A seq that is not the job's next: gone, a gap, or (else) a resend that is a no-op.
local function refuse(id, h, next_seq, seq)
  local status = redis.call('HGET', h, F_STATUS)
  if status ~= S_RUNNING then
    if not status then
      redis.call('DEL', h)  -- the HINCRBY made the hash of an unknown job
    end
    refused[id] = true
    table.insert(gone, id)
  elseif seq > next_seq then
    refused[id] = true
    table.insert(behind, id)
    table.insert(behind, next_seq)
  end
end

for i = 27, #ARGV, 3 do
  local id = ARGV[i]
  if not refused[id] then
    local h = key(T_HASH, id)
    local seq = tonumber(ARGV[i + 1])
    local next_seq = redis.call('HINCRBY', h, F_NEXT_SEQ, 1) - 1
    if next_seq ~= seq or seq == 0 then  -- seq 0 is START's, never EMIT's
      redis.call('HINCRBY', h, F_NEXT_SEQ, -1)
      refuse(id, h, next_seq, seq)
    elseif not append(id, seq, ARGV[i + 2]) then
      redis.call('HINCRBY', h, F_NEXT_SEQ, -1)
      refused[id] = true
      table.insert(gone, id)
    end
  end
end
return {gone, behind}
