-- KEYS: v (unused) lock fence (unused): the unused slots keep the others' places.
-- ARGV: token (empty: no lease) fence mode value fresh_ms hard_ms channel wake fence_retention_ms pass_ms
--       entry_prefix fence_offset carry
-- mode: store (value, hard_ms), pass (pass_ms) or release (nothing). Freshness
-- needs no key of its own: the entry's stale window is in its encoding, and
-- the lookup takes it off v's PTTL. A pass marker is entry_prefix .. 'pass' in v.
-- The channel carries the entry's hash tag (same slot as KEYS on a cluster).
-- The notice is the stored entry itself when carry = '1' and it was
-- accepted, else `wake` (waiters then look it up).
-- Returns {accepted, released}: accepted is 1, 0 (fenced off) or 2 (a pass
-- marker not set over a fresh entry); released is 0 or 1.
local f = tonumber(ARGV[2])
-- A write is accepted only with a token strictly newer than the newest
-- write (or purge) we know of: `hw`, or, when the fence hash has none (lost
-- since the lease, or this key leased nowhere: a copy), the fence the stored
-- entry was written with (it is part of the encoding), so a leader from
-- before the loss cannot replace a newer entry. The lookup that leased gave
-- a new hash its `hw`, so a fill under a lease reads one field here.
local hw = tonumber(redis.call('HGET', KEYS[4], 'hw'))
local floor = hw
if not floor then
  floor = entry_fence(redis.pcall('GET', KEYS[1]), ARGV[11], tonumber(ARGV[12]))
end
-- Extend the fence hash to `ms` if that is longer than it has: GT where
-- `hw` was there (every writer of the hash gives it an expiry), a plain
-- PEXPIRE otherwise (a new hash, or one only ever given the retention).
local function keep_fence(ms)
  if hw then
    redis.call('PEXPIRE', KEYS[4], ms, 'GT')
  else
    redis.call('PEXPIRE', KEYS[4], ms)
  end
end
-- Whether v holds an entry of this version that is still fresh: its PTTL
-- past its keep time (u64 LE at byte 36), as the lookup reckons it.
local function fresh_entry_held()
  local cur = redis.pcall('GET', KEYS[1])
  local prefix = ARGV[11]
  if type(cur) ~= 'string' or string.len(cur) < 44 or cur == prefix .. 'pass'
      or string.sub(cur, 1, string.len(prefix)) ~= prefix then
    return false
  end
  local kept = 0
  for i = 44, 37, -1 do kept = kept * 256 + string.byte(cur, i) end
  return redis.call('PTTL', KEYS[1]) - kept > 0
end
local accepted = 0
if ARGV[3] ~= 'release' then
  if f > floor then
    if ARGV[3] == 'store' then
      redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[6])
    elseif fresh_entry_held() then
      -- A pass marker never replaces a fresh entry: the answer that says
      -- "uncacheable" may have been made for one request alone.
      accepted = 2
    else
      -- The origin now says uncacheable: the old entry must not be served.
      redis.call('SET', KEYS[1], ARGV[11] .. 'pass', 'PX', ARGV[10])
    end
    if accepted == 0 then
      redis.call('HSET', KEYS[4], 'hw', ARGV[2])
      -- Kept while the entry lives, and past that as long as a fill that
      -- leased before its expiry may still write.
      keep_fence(tonumber(ARGV[9]) + tonumber(ARGV[6]))
      accepted = 1
    end
  else
    redis.call('HINCRBY', KEYS[4], 'rejected', 1)
    keep_fence(tonumber(ARGV[9]))
  end
end
local released = 0
-- An empty token: no lease guards this write (a copy, a write outside a
-- flight), so there is none to look at.
if ARGV[1] ~= '' and redis.call('GET', KEYS[3]) == ARGV[1] then
  redis.call('DEL', KEYS[3])
  released = 1
end
-- Best effort: waiters also poll, and a server without sharded pub/sub
-- (before Redis 7) must not turn a stored entry into a failed write.
local notice = ARGV[8]
if accepted == 1 and ARGV[13] == '1' then notice = ARGV[4] end
redis.pcall('SPUBLISH', ARGV[7], notice)
return {accepted, released}
