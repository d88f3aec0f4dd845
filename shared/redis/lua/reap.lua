-- REAP: the job library's KEYS and ARGV[1..7] (library.lua), then
-- ARGV[8] the most leases to reap in this call.
-- Returns the ids of the running jobs it failed with the lease-expired error (RQ still shows
-- them started); a running job with attempts left goes back to its queue instead
-- (`continue_job`, library.lua).
return reap(now_ms(), tonumber(ARGV[8]))
