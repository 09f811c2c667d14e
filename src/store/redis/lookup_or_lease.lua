-- KEYS: v fresh lock fence pass
-- ARGV: token lease_ms skip_entry fence_retention_ms entry_prefix lookup_only ahead_ms
-- lookup_only = '1' when the lease lives elsewhere (Redlock): never lease here.
-- ahead_ms > 0 (refresh-ahead): lease a fresh entry with at most that long left.
-- Returns {status, value, fresh_ms, hard_ms, fence, lease_or_pass_ms}; status is
-- fresh, stale, stale_leased, leased, held, pass or miss.
local v = false
if ARGV[3] ~= '1' then
  -- A value of another type (WRONGTYPE) is foreign: a miss, and the fill's
  -- SET overwrites it, instead of an error on every request.
  v = redis.pcall('GET', KEYS[1])
  if type(v) == 'table' then v = false end
end
-- An entry this version cannot read is a miss; the leader overwrites it.
if v and string.sub(v, 1, string.len(ARGV[5])) ~= ARGV[5] then v = false end
if v then
  local fresh = redis.call('PTTL', KEYS[2])
  local hard = redis.call('PTTL', KEYS[1])
  if fresh > 0 and (fresh > tonumber(ARGV[7]) or ARGV[6] == '1'
      or not redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2])) then
    return {'fresh', v, fresh, hard, 0, 0}
  end
  if fresh > 0 then
    local f = issue_fence(KEYS[4], tonumber(ARGV[4]))
    return {'leased', '', 0, 0, f, 0}
  end
  if ARGV[6] == '1' then return {'stale', v, 0, hard, 0, 0} end
  if redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local f = issue_fence(KEYS[4], tonumber(ARGV[4]))
    return {'stale_leased', v, 0, hard, f, 0}
  end
  return {'stale', v, 0, hard, 0, redis.call('PTTL', KEYS[3])}
end
local pass = redis.call('PTTL', KEYS[5])
if pass > 0 then return {'pass', '', 0, 0, 0, pass} end
if ARGV[6] == '1' then return {'miss', '', 0, 0, 0, 0} end
if redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local f = issue_fence(KEYS[4], tonumber(ARGV[4]))
  return {'leased', '', 0, 0, f, 0}
end
return {'held', '', 0, 0, 0, redis.call('PTTL', KEYS[3])}
