-- KEYS: v fresh pass fence lock
-- ARGV: fence_retention_ms
-- Returns the raised fence, or 0 when nothing of the key was there.
-- Delete the entry and raise `hw` to a fresh token: every leader that leased
-- before the purge holds an older token, so its fenced write is refused and
-- the purge is not undone by a fill that started before it. The fence is
-- raised whenever anything of the key exists, also when its hash is gone
-- while a lease is held (evicted, flushed): that leader's token came from
-- the clock before now, so it is below the new mark. Only a key with nothing
-- at all (a POST's target that was never an entry) is left without a fence.
local deleted = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if deleted == 0 and redis.call('EXISTS', KEYS[4], KEYS[5]) == 0 then return 0 end
-- Raised, and kept at least the retention (a longer life it has stays).
return issue_fence(KEYS[4], tonumber(ARGV[1]), nil, nil, nil, true, true)
