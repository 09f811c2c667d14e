-- KEYS: group index (sorted set), the group's purge stamp
-- ARGV: ttl_ms member... (hex entry keys)
-- Returns {stamp_us, now_us}: when the group was last purged (server clock,
-- 0 if not within the retention) and the server clock now. A fill indexes
-- its keys here *before* its fenced write: a purge that read the index
-- before this call stamped the group first, so the caller sees the stamp and
-- stores nothing; a purge that reads it after finds the keys and raises
-- their fences. Either way the purge holds, notice or no notice.
-- Members are scored by when their entry expires (server clock) and the
-- expired ones are trimmed on every write (a new index has none), so the
-- index holds only the group's live entries: it cannot outgrow what Redis
-- stores.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local ttl = tonumber(ARGV[1])
local members = {}
for i = 2, #ARGV do
  members[#members + 1] = now + ttl
  members[#members + 1] = ARGV[i]
end
-- A key of another type under the index's name is foreign (nothing this
-- release writes): replaced, not an error on every fill of the group.
local added = redis.pcall('ZADD', KEYS[1], unpack(members))
if type(added) ~= 'number' then
  -- Any other error (OOM on a full server) stops here, before any write: a
  -- DEL first would let the script write on past the limit, with the
  -- group's other members gone.
  if not string.find(added.err or '', 'WRONGTYPE', 1, true) then error(added) end
  redis.call('DEL', KEYS[1])
  added = redis.call('ZADD', KEYS[1], unpack(members))
end
-- Kept as long as its longest-lived member. NX gives a new index (no
-- expiry yet) its own, and it holds nothing expired to trim; an older one
-- (certainly older when no member was new: a refill) is trimmed and only
-- ever extended (GT).
if added == 0 or redis.call('PEXPIRE', KEYS[1], ttl, 'NX') == 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('PEXPIRE', KEYS[1], ttl, 'GT')
end
local stamp = tonumber(redis.pcall('GET', KEYS[2])) or 0
return {stamp, now_us}
