-- KEYS: group index (sorted set), its older plain-set form, the group's purge stamp
-- ARGV: ttl_ms member... (hex entry keys)
-- Returns {stamp_us, now_us}: when the group was last purged (server clock,
-- 0 if not within the retention) and the server clock now. A fill indexes
-- its keys here *before* its fenced write: a purge that read the index
-- before this call stamped the group first, so the caller sees the stamp and
-- stores nothing; a purge that reads it after finds the keys and raises
-- their fences. Either way the purge holds, notice or no notice.
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
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
local stamp = tonumber(redis.pcall('GET', KEYS[3])) or 0
return {stamp, now_us}
