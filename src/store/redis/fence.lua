-- KEYS, ARGV: none. Functions only, prepended to the scripts that issue or
-- check fence tokens (lookup_or_lease, fenced_write, purge_entry,
-- soft_purge_entry, next_fence); they pass the fence key and the retention in.
-- The fence key is one string, `<next>:<hw>`: `next` the last token issued,
-- `hw` the highest token accepted, or raised by a purge (empty when not
-- known: then the entry's own token is the floor). One string, not a hash,
-- so reading it is one GET and writing it with its expiry one SET PX.
-- Tokens are whole numbers below 2^53, exact as Lua numbers; they are
-- written back with %.0f, never tostring (which would round them to 14
-- digits).

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

-- The fence of `fk`: next and hw (numbers, or nil where not known). A value
-- of another type (an older release kept a hash here) or of another shape
-- counts as none; the next write of the fence replaces it.
local function read_fence(fk)
  local s = redis.pcall('GET', fk)
  if type(s) ~= 'string' then return nil, nil end
  local n, h = string.match(s, '^(%d+):(%d*)$')
  return tonumber(n), tonumber(h)
end

-- Write the fence with its expiry in one command.
local function write_fence(fk, issued, hw, px)
  local h = ''
  if hw then h = string.format('%.0f', hw) end
  redis.call('SET', fk, string.format('%.0f', issued) .. ':' .. h, 'PX', string.format('%.0f', px))
end

-- The next token: above the last issued, above `hw` and above the server
-- clock in microseconds. Tokens therefore never repeat, not even after a
-- failover to a replica that missed the last ones (its counter lags, the
-- clock does not), nor after the fence was lost (FLUSHALL, eviction, restart
-- without persistence); and tokens of different keys on one server compare
-- by when they were issued, so a copy filed under a second key is fenced by
-- the token of the fill that made it.
-- `entry` (optional): what the caller read from the entry key, with `prefix`
-- and `at` to read its token. A fence without `hw` (new, or lost) then gets
-- the entry's token (0 for none) as `hw`, so the fenced write that follows
-- needs no read of the entry. `raise`: `hw` becomes the new token (a purge).
-- The fence is then kept for the retention: `keep` keeps a longer life it
-- has (one PTTL more); without it (the lookup that leases, on the request
-- path) the life may be cut to the retention, which is safe: a lost fence
-- falls back to the entry's own token, the same `hw` a write recorded, and
-- the retention outlives every lease that could still write.
local function issue_fence(fk, retention_ms, entry, prefix, at, raise, keep)
  local issued, hw = read_fence(fk)
  local now = fence_clock()
  if not hw and entry ~= nil then hw = entry_fence(entry, prefix, at, now) end
  local f = math.max(issued or 0, hw or 0, now) + 1
  if raise then
    hw = f
  end
  local px = retention_ms
  if keep then px = math.max(px, redis.call('PTTL', fk)) end
  write_fence(fk, f, hw, px)
  return f
end
