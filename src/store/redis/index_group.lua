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
index_members(KEYS[1], members, ttl, now)
local stamp = tonumber(redis.pcall('GET', KEYS[2])) or 0
return {stamp, now_us}
