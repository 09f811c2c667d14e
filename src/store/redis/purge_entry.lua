-- KEYS: v fresh pass fence
-- ARGV: fence_retention_ms
-- Returns the raised fence, or 0 when the key had no fence hash.
-- Delete the entry and raise `hw` to a fresh token: every leader that leased
-- before the purge holds an older token, so its fenced write is refused and
-- the purge is not undone by a fill that started before it. No fence hash, no
-- lease to beat (or it was lost with a flush): none is created, so purging
-- URLs that are not entries (a POST's target) leaves nothing behind. The
-- leader's own process still refuses to store after hearing the purge.
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if redis.call('EXISTS', KEYS[4]) == 0 then return 0 end
local f = issue_fence(KEYS[4], tonumber(ARGV[1]))
redis.call('HSET', KEYS[4], 'hw', string.format('%.0f', f))
return f
