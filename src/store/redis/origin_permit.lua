-- KEYS: budget (a sorted set: permit id -> its expiry, ms on the server's clock)
-- ARGV: id, limit, keep (permits to leave free for calls somebody waits for), ttl_ms
-- Take one of the cluster's origin permits if fewer than limit - keep are
-- out. Permits past their expiry (an instance that crashed holding them)
-- are dropped first. Returns {taken (1) or not (0), permits out}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local out = redis.call('ZCARD', KEYS[1])
if out + tonumber(ARGV[3]) >= tonumber(ARGV[2]) then
  return {0, out}
end
local ttl = tonumber(ARGV[4])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
-- The set lives as long as its last permit (instances may differ in ttl):
-- an expiry if it has none, else a later one only.
redis.call('PEXPIRE', KEYS[1], ttl, 'NX')
redis.call('PEXPIRE', KEYS[1], ttl, 'GT')
return {1, out + 1}
