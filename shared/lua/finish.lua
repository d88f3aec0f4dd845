-- FINISH: the job library's KEYS and ARGV[1..26] (library.lua), then
-- ARGV[27] job id, ARGV[28] terminal status, ARGV[29] hash fields (JSON object),
-- ARGV[30] final event (JSON without seq). Returns 1 if this call ended the job.
local done = finish(ARGV[27], ARGV[28], cjson.decode(ARGV[29]), ARGV[30])
return done and 1 or 0
