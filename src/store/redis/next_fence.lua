-- KEYS: fence
-- ARGV: fence_retention_ms
-- Returns the new token.
-- Not the request path: one PTTL more keeps a longer life the fence has.
return issue_fence(KEYS[1], tonumber(ARGV[1]), nil, nil, nil, false, true)
