-- KEYS, ARGV: none. Functions only, prepended to the scripts that issue fence
-- tokens (lookup_or_lease, fenced_write, purge_entry, next_fence); they pass
-- the fence hash key and the retention in.
-- The fence hash holds `next` (last token issued) and `hw` (highest token
-- accepted, or raised by a purge). Tokens are whole numbers below 2^53, exact
-- as Lua numbers; they are written back with %.0f, never tostring (which
-- would round them to 14 digits).

-- Microseconds on the server clock.
local function fence_clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The next token: above the last issued and above `hw`, so a purge or a
-- late write never leaves new leases below the mark. A counter that vanished
-- (FLUSHALL, eviction, restart without persistence) starts again from the
-- clock, above every token issued before it: those came from a counter that
-- started earlier and grew by one per script call, far slower than 1 per us.
local function issue_fence(fk, retention_ms)
  local issued = tonumber(redis.call('HGET', fk, 'next'))
  local hw = tonumber(redis.call('HGET', fk, 'hw')) or 0
  local base
  if issued then base = math.max(issued, hw) else base = math.max(fence_clock(), hw) end
  local f = base + 1
  redis.call('HSET', fk, 'next', string.format('%.0f', f))
  if redis.call('PTTL', fk) < retention_ms then redis.call('PEXPIRE', fk, retention_ms) end
  return f
end
