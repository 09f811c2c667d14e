-- KEYS: fence
-- ARGV: fence_retention_ms
return issue_fence(KEYS[1], tonumber(ARGV[1]))
