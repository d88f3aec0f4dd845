-- CANCEL: the job library's KEYS and ARGV[1..7] (library.lua), then
-- ARGV[8] job id, ARGV[9] the workers' cancel channel.
-- A queued job ends cancelled at once; a running job is flagged and its worker told.
-- Returns the cancelled status, 'cancelling' (a running job being stopped), the terminal
-- status it already had, or false when the job is unknown.
local id = ARGV[8]
local h = key(T_HASH, id)
local current = redis.call('HGET', h, F_STATUS)
if current == S_QUEUED then
  fail(id, S_CANCELLED, 'cancelled_before_start')
  return S_CANCELLED
elseif current == S_RUNNING then
  redis.call('HSET', h, F_CANCEL_REQUESTED, '1')
  redis.call('PUBLISH', ARGV[9], id)
  return 'cancelling'
end
return current
