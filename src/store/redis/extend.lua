-- KEYS: lock
-- ARGV: token ttl_ms
-- Extend the lease only while `token` still holds it. Returns 1 if extended.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
