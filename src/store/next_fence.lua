-- KEYS: fence
-- ARGV: fence_retention_ms
local f = redis.call('HINCRBY', KEYS[1], 'next', 1)
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return f
