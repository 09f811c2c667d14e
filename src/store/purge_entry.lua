-- KEYS: v fresh pass fence
-- ARGV: fence_retention_ms
-- Delete the entry and raise `hw` to a fresh token: every leader that leased
-- before the purge holds an older token, so its fenced write is refused and
-- the purge is not undone by a fill that started before it.
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
local f = issue_fence(KEYS[4], tonumber(ARGV[1]))
redis.call('HSET', KEYS[4], 'hw', string.format('%.0f', f))
return f
