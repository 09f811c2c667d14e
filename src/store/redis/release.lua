-- KEYS: lock
-- ARGV: token
-- Compare-and-delete: release the lease only while `token` still holds it.
-- Returns 1 if released.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
