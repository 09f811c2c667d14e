-- KEYS: v lock fence
-- ARGV: token lease_ms skip_entry fence_retention_ms entry_prefix lookup_only ahead_ms
--       fence_offset
-- `v` holds the entry (PX = hard expiry) or the pass marker (entry_prefix
-- .. 'pass', PX = pass TTL). Freshness is what is left of the hard expiry
-- past the entry's keep time (u64 LE at byte 36 of the encoding: its stale
-- window, or its stale-if-error window when longer), so one key and one
-- clock (the server's) say both.
-- skip_entry = '1': the entry is not wanted (corrupt, or refused by a forced
-- refresh); a pass marker still counts.
-- lookup_only = '1' when the lease lives elsewhere (Redlock): never lease here.
-- ahead_ms > 0 (refresh-ahead): lease a fresh entry with at most that long left.
-- Returns {status, value, fresh_ms, hard_ms, fence, lease_bound_ms, holder};
-- status is fresh, stale, stale_leased, leased, held, pass, miss, or, on a
-- full server where no lease can be taken, stale_full or full. `holder`
-- is the lease token of whoever holds the lease (held, stale), so a waiter
-- can later check that lease alone instead of looking again.
-- A value of another type (WRONGTYPE) is foreign: a miss, and the fill's
-- SET overwrites it, instead of an error on every request.
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then v = false end
local prefix = ARGV[5]
-- What v held, for the fence: a new or lost fence takes its `hw` from
-- the entry's own token, so the fenced write need not read v again.
local held = v
local function fence()
  return issue_fence(KEYS[3], tonumber(ARGV[4]), held or '', prefix, tonumber(ARGV[8]))
end
-- An entry this version cannot read is a miss; the leader overwrites it.
if v and string.sub(v, 1, string.len(prefix)) ~= prefix then v = false end
if v == prefix .. 'pass' then return {'pass', '', 0, 0, 0, redis.call('PTTL', KEYS[1]), ''} end
if ARGV[3] == '1' then v = false end
local lease_ms = tonumber(ARGV[2])
-- SET NX GET: the lease if free, else the holder's token, in one command.
-- A full server (noeviction at maxmemory) refuses it with OOM: then `full`
-- is set and the lease counts as held (by no one), so what can be read is
-- still answered.
local full = false
local function lease()
  local r = redis.pcall('SET', KEYS[2], ARGV[1], 'NX', 'PX', lease_ms, 'GET')
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 3) ~= 'OOM' then error(r) end
    full = true
    return ''
  end
  return r
end
if v then
  local hard = redis.call('PTTL', KEYS[1])
  -- The keep time past freshness (u64 LE at byte 36: the stale window, or
  -- the stale-if-error window when longer). Too short to hold one: corrupt,
  -- and reported so by the caller.
  local kept = 0
  if string.len(v) >= 44 then
    for i = 44, 37, -1 do kept = kept * 256 + string.byte(v, i) end
  end
  local fresh = hard - kept
  if fresh > 0 and (fresh > tonumber(ARGV[7]) or ARGV[6] == '1') then
    return {'fresh', v, fresh, hard, 0, 0, ''}
  end
  if fresh > 0 then
    if lease() then return {'fresh', v, fresh, hard, 0, 0, ''} end
    local f = fence()
    return {'leased', '', 0, 0, f, 0, ''}
  end
  if ARGV[6] == '1' then return {'stale', v, 0, hard, 0, 0, ''} end
  local holder = lease()
  if full then return {'stale_full', v, 0, hard, 0, 0, ''} end
  if not holder then
    local f = fence()
    return {'stale_leased', v, 0, hard, f, 0, ''}
  end
  return {'stale', v, 0, hard, 0, lease_ms, holder}
end
if ARGV[6] == '1' then return {'miss', '', 0, 0, 0, 0, ''} end
local holder = lease()
if full then return {'full', '', 0, 0, 0, 0, ''} end
if not holder then
  local f = fence()
  return {'leased', '', 0, 0, f, 0, ''}
end
return {'held', '', 0, 0, 0, lease_ms, holder}
