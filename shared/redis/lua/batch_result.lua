-- BATCH_RESULT: write one batch line's result, once.
-- KEYS[1] the batch's results (hash: line index -> result), KEYS[2] the batch hash,
-- KEYS[3] the batch's pending lines (hash: line index -> job id).
-- ARGV[1] the line index, ARGV[2] the result, ARGV[3] the batch hash's count field to
-- increment (completed or failed).
-- The first result of a line is kept and counted; any later one is dropped. Either way the
-- line is no longer pending. Returns 1 when this result was written, 0 when one was there.
local written = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if written == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
end
redis.call('HDEL', KEYS[3], ARGV[1])
return written
