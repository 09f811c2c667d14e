-- KEYS: group index, the group's purge stamp
-- ARGV: stamp_retention_ms
-- The start of a group purge: stamp the group purged now (server clock, us)
-- *before* its index is read, so a fill indexed after the read sees the
-- stamp (see index_group.lua). Returns {kind of the index, its size}.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('SET', KEYS[2], string.format('%.0f', now_us), 'PX', ARGV[1])
local kind = redis.call('TYPE', KEYS[1]).ok
local n = 0
if kind == 'zset' then n = redis.call('ZCARD', KEYS[1]) end
return {kind, n}
