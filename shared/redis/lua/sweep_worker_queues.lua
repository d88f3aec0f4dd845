-- SWEEP_WORKER_QUEUES (after clock.lua): KEYS[1] the model's placement workers (zset:
-- member a worker name, score its heartbeat's expiry in ms).
-- ARGV[1] a worker that leaves now ('' for none), ARGV[2] the most dead workers to sweep,
-- ARGV[3] RQ's job key prefix, ARGV[4] RQ's queue key prefix, ARGV[5] RQ's job hash field
-- `origin`, ARGV[6..] the worker queues' RQ keys with `{id}` for the worker name, one per
-- priority (`keys.worker_queue`: built here, as the job library builds a job's keys).
-- Hands every job in the queues of the leaving worker and of the workers whose heartbeat
-- expired to the front of its RQ origin queue (the model's queue of its priority), in its
-- order, and drops those workers from KEYS[1]: from then on ADMIT places nothing on them.
-- Returns {jobs handed over, then name, backlog (jobs in its queues) of each live worker}.
local now = now_ms()
local leaving = {}
if ARGV[1] ~= '' then
  leaving[1] = ARGV[1]
end
for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[2])) do
  leaving[#leaving + 1] = name
end
local moved = 0
for _, name in ipairs(leaving) do
  redis.call('ZREM', KEYS[1], name)
  for p = 6, #ARGV do
    local queue = string.gsub(ARGV[p], '{id}', name)
    local ids = redis.call('LRANGE', queue, 0, -1)
    for i = #ids, 1, -1 do
      local origin = redis.call('HGET', ARGV[3] .. ids[i], ARGV[5])
      if origin then
        redis.call('LPUSH', ARGV[4] .. origin, ids[i])
        moved = moved + 1
      end
    end
    redis.call('DEL', queue)
  end
end
local reply = {moved}
for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
  local backlog = 0
  for p = 6, #ARGV do
    backlog = backlog + redis.call('LLEN', (string.gsub(ARGV[p], '{id}', name)))
  end
  reply[#reply + 1] = name
  reply[#reply + 1] = backlog
end
return reply
