-- KEYS: lock large
-- ARGV: token ttl_ms channel key_hex
-- The lease holder's fill turned out too large to store: say so, and wake the
-- instances waiting on the lease (same channel and payload as a fill) so each
-- calls the origin once now instead of waiting for a fill that never comes.
-- Only while `token` still holds the lease. Returns 1 if marked, else 0.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
-- Best effort, as for a fill: waiters also poll.
redis.pcall('SPUBLISH', ARGV[3], ARGV[4])
return 1
