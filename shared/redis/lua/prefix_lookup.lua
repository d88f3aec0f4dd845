-- PREFIX_LOOKUP (after clock.lua): no KEYS; the model's prefix index is one hash per epoch,
-- whose keys are built here from ARGV[1] (`keys.prefix_index` with `{id}` for the epoch),
-- as the job library builds a job's keys from its templates (library.lua).
-- ARGV[1] the index key template, ARGV[2] an epoch's length (ms), ARGV[3..] the prompt's
-- block hashes as index fields (`shared.redis.placement.index_fields`), first block first.
-- Returns {blocks, worker}: the deepest block that this epoch's or the previous epoch's hash
-- names, how many blocks deep it is and the worker that prefilled it; {} when none.
local now = now_ms()
local epoch = math.floor(now / tonumber(ARGV[2]))
local current = redis.call('HMGET', (string.gsub(ARGV[1], '{id}', epoch)), unpack(ARGV, 3))
local previous = redis.call('HMGET', (string.gsub(ARGV[1], '{id}', epoch - 1)), unpack(ARGV, 3))
for i = #current, 1, -1 do
  local worker = current[i] or previous[i]
  if worker then
    return {i, worker}
  end
end
return {}
