-- KEYS: fence
-- ARGV: fence_retention_ms
-- Returns the new token.
return issue_fence(KEYS[1], tonumber(ARGV[1]))
