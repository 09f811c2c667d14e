-- KEYS: group index (sorted set), its older plain-set form
-- ARGV: member (hex entry key) ttl_ms
-- Members are scored by when their entry expires (server clock) and the
-- expired ones are trimmed on every write, so the index holds only the
-- group's live entries: it cannot outgrow what Redis stores.
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'set' then
  -- Written by an older version: kept aside (its TTL no longer extended),
  -- still walked by purges until it expires.
  redis.call('RENAME', KEYS[1], KEYS[2])
elseif kind ~= 'zset' and kind ~= 'none' then
  redis.call('DEL', KEYS[1])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
