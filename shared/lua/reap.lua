-- REAP: the job library's KEYS and ARGV[1..26] (library.lua), then
-- ARGV[27] the most leases to reap in this call.
-- Returns the ids of the running jobs it failed with the lease-expired error (RQ still shows
-- them started).
return reap(now_ms(), tonumber(ARGV[27]))
