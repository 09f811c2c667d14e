-- KEYS: v (unused) lock fence (unused), then for each purge group folded
--       into this write: its index and its purge stamp. The unused slots keep
--       the others' places.
-- ARGV: token (empty: no lease) fence mode value fresh_ms hard_ms channel wake fence_retention_ms pass_ms
--       entry_prefix fence_offset carry lease_here index_ttl_ms since_ms stamp_margin_us member...
-- mode: store (value, hard_ms), pass (pass_ms) or release (nothing). Freshness
-- needs no key of its own: the entry's stale window is in its encoding, and
-- the lookup takes it off v's PTTL. A pass marker is entry_prefix .. 'pass' in v.
-- The channel carries the entry's hash tag (same slot as KEYS on a cluster).
-- The notice is the stored entry itself when carry = '1' and it was
-- accepted, else `wake` (waiters then look it up).
-- Groups (a single server only: on a cluster each index has its own slot
-- and index_group.lua records it before this write): the members are
-- indexed and the stamps read in the same script as the write, so a purge
-- either ran before (its stamp refuses the write) or after (it finds the
-- members and raises their fences). `fence` is the lease's token, a reading
-- of this server's clock taken before the computation: a stamp it is not
-- more than stamp_margin_us above dates a purge after the lease, and then
-- nothing is stored. Members are scored by when their entry expires,
-- reckoned from the token and since_ms (this process's time since it asked
-- for the lease, so never less than what passed here, up to the write's own
-- transit, which index_ttl_ms's margin covers): no TIME needed.
-- Returns {accepted, released}: accepted is 1, 0 (fenced off), 2 (a pass
-- marker not set over a fresh entry) or 3 (a group was purged since the
-- lease: nothing stored); released is 0 or 1.
local f = tonumber(ARGV[2])
-- A write is accepted only with a token strictly newer than the newest
-- write (or purge) we know of: `hw`, or, when the fence has none (lost
-- since the lease, or this key leased nowhere: a copy), the fence the stored
-- entry was written with (it is part of the encoding), so a leader from
-- before the loss cannot replace a newer entry. The lookup that leased gave
-- a new fence its `hw`, so a fill under a lease reads one key here.
local issued, hw = read_fence(KEYS[4])
local floor = hw
if not floor then
  floor = entry_fence(redis.pcall('GET', KEYS[1]), ARGV[11], tonumber(ARGV[12]))
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
-- Whether a folded group was purged since the lease (see above).
local groups = (#KEYS - 5) / 2
local function purged_since_lease()
  local margin = tonumber(ARGV[17])
  for g = 0, groups - 1 do
    local stamp = tonumber(redis.pcall('GET', KEYS[7 + 2 * g])) or 0
    if stamp > 0 and f <= stamp + margin then return true end
  end
  return false
end
-- Record the members in each folded group's index (see index.lua).
local function index_folded()
  local ttl = tonumber(ARGV[15])
  local leased_ms = math.floor(f / 1000)
  local score = leased_ms + tonumber(ARGV[16]) + ttl
  local members = {}
  for i = 18, #ARGV do
    members[#members + 1] = score
    members[#members + 1] = ARGV[i]
  end
  for g = 0, groups - 1 do
    -- Trimmed below the lease's time less a second: a token runs ahead of
    -- this clock only by the skew a failover brings (its `next` or `hw`
    -- from the old master's clock), and a live member must not be trimmed.
    index_members(KEYS[6 + 2 * g], members, ttl, leased_ms - 1000)
  end
end
local accepted = 0
if ARGV[3] ~= 'release' then
  if f > floor then
    if ARGV[3] == 'store' and groups > 0 and purged_since_lease() then
      accepted = 3
    elseif ARGV[3] == 'store' then
      if groups > 0 then index_folded() end
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
      -- Kept while the entry lives, and past that as long as a fill that
      -- leased before its expiry may still write.
      write_fence(KEYS[4], math.max(issued or 0, f), f,
        tonumber(ARGV[9]) + tonumber(ARGV[6]))
      accepted = 1
    end
  end
end
local released = 0
-- An empty token: no lease guards this write (a copy, a write outside a
-- flight), so there is none to look at. Where the lease is taken here
-- (lease_here = '1'), every lease is taken by a lookup that issues a token
-- and records it as `next`: when `next` is still ours, so is any lease on
-- the key, and it is deleted without a read. Otherwise (a newer token was
-- issued, the fence was lost, or the lease lives elsewhere) compare first.
if ARGV[1] ~= '' then
  if ARGV[14] == '1' and issued == f then
    released = redis.call('DEL', KEYS[3])
  elseif redis.call('GET', KEYS[3]) == ARGV[1] then
    redis.call('DEL', KEYS[3])
    released = 1
  end
end
-- Best effort: waiters also poll, and a server without sharded pub/sub
-- (before Redis 7) must not turn a stored entry into a failed write.
local notice = ARGV[8]
if accepted == 1 and ARGV[13] == '1' then notice = ARGV[4] end
redis.pcall('SPUBLISH', ARGV[7], notice)
return {accepted, released}
