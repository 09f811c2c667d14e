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

-- The next token: above the last issued, above `hw` and above the server
-- clock in microseconds. Tokens therefore never repeat, not even after a
-- failover to a replica that missed the last ones (its counter lags, the
-- clock does not), nor after the hash was lost (FLUSHALL, eviction, restart
-- without persistence); and tokens of different keys on one server compare
-- by when they were issued, so a copy filed under a second key is fenced by
-- the token of the fill that made it.
local function issue_fence(fk, retention_ms)
  local issued = tonumber(redis.call('HGET', fk, 'next')) or 0
  local hw = tonumber(redis.call('HGET', fk, 'hw')) or 0
  local f = math.max(issued, hw, fence_clock()) + 1
  redis.call('HSET', fk, 'next', string.format('%.0f', f))
  if redis.call('PTTL', fk) < retention_ms then redis.call('PEXPIRE', fk, retention_ms) end
  return f
end
