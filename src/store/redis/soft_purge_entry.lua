-- KEYS: v fresh pass fence lock
-- ARGV: fence_retention_ms entry_prefix
-- Returns the raised fence, or 0 when nothing of the key was there.
-- A soft purge keeps the entry but ends its freshness now. Freshness is
-- what is left of v's PTTL past the entry's keep time (u64 LE at byte 36:
-- its stale window, or stale-if-error when longer), so cutting the PTTL to
-- the keep time makes every lookup see it stale from now on, its stale
-- window and stale-if-error counted from now (an entry already stale keeps
-- its shorter PTTL). An entry kept for nothing past its freshness (no stale
-- window, no stale-if-error: must-revalidate, no-cache and the like) and a
-- pass marker are deleted, as by a purge. Either way the fence is raised
-- as by a purge (see purge_entry.lua): a fill that leased before is
-- refused, so it never lands fresh over the soft purge.
local v = redis.pcall('GET', KEYS[1])
local prefix = ARGV[2]
local kept = 0
if type(v) == 'string' and string.len(v) >= 44 and v ~= prefix .. 'pass'
    and string.sub(v, 1, string.len(prefix)) == prefix then
  for i = 44, 37, -1 do kept = kept * 256 + string.byte(v, i) end
end
local found
if kept > 0 then
  if redis.call('PTTL', KEYS[1]) > kept then
    redis.call('PEXPIRE', KEYS[1], string.format('%.0f', kept))
  end
  redis.call('DEL', KEYS[2], KEYS[3])
  found = 1
else
  found = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
end
if found == 0 and redis.call('EXISTS', KEYS[4], KEYS[5]) == 0 then return 0 end
-- Raised, and kept at least the retention (a longer life it has stays).
return issue_fence(KEYS[4], tonumber(ARGV[1]), nil, nil, nil, true, true)
