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

-- The token an entry of this version was written with (u64 LE after byte
-- `at` of its encoding), or 0 for anything else (nothing, a pass marker,
-- another version). Tokens never run ahead of the clock they start from; one
-- more than a minute past `now_us` (more than any sane clock skew) is
-- corruption, and must not hold writes off.
local function entry_fence(cur, prefix, at, now_us)
  if type(cur) ~= 'string' or string.sub(cur, 1, string.len(prefix)) ~= prefix
      or string.len(cur) < at + 8 then
    return 0
  end
  local vf = 0
  for i = at + 8, at + 1, -1 do vf = vf * 256 + string.byte(cur, i) end
  if vf <= (now_us or fence_clock()) + 60000000 then return vf end
  return 0
end

-- The next token: above the last issued, above `hw` and above the server
-- clock in microseconds. Tokens therefore never repeat, not even after a
-- failover to a replica that missed the last ones (its counter lags, the
-- clock does not), nor after the hash was lost (FLUSHALL, eviction, restart
-- without persistence); and tokens of different keys on one server compare
-- by when they were issued, so a copy filed under a second key is fenced by
-- the token of the fill that made it.
-- `entry` (optional): what the caller read from the entry key, with `prefix`
-- and `at` to read its token. A hash without `hw` (new, or lost) then gets
-- the entry's token (0 for none) as `hw`, so the fenced write that follows
-- needs no read of the entry. `raise`: `hw` becomes the new token (a purge).
-- One read, one write, and one PEXPIRE that never shortens the hash's life:
-- GT where the hash was there (every writer of it sets an expiry), a plain
-- one on a new hash (or one holding only a rejection count, which never
-- lives longer than the retention it was given).
local function issue_fence(fk, retention_ms, entry, prefix, at, raise)
  local got = redis.call('HMGET', fk, 'next', 'hw')
  local issued, hw = tonumber(got[1]), tonumber(got[2])
  local now = fence_clock()
  local had = issued or hw
  if not hw and entry ~= nil then hw = entry_fence(entry, prefix, at, now) end
  local f = math.max(issued or 0, hw or 0, now) + 1
  if raise then
    hw = f
  end
  local token = string.format('%.0f', f)
  if hw then
    redis.call('HSET', fk, 'next', token, 'hw', string.format('%.0f', hw))
  else
    redis.call('HSET', fk, 'next', token)
  end
  if had then
    redis.call('PEXPIRE', fk, retention_ms, 'GT')
  else
    redis.call('PEXPIRE', fk, retention_ms)
  end
  return f
end
