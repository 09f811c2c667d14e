-- KEYS, ARGV: none. A function only, prepended to the scripts that record a
-- fill in a purge group's index (index_group, fenced_write).

-- Record `members` (score, member, score, member …: scored by when each
-- entry expires, in ms) in the index `ik`, kept `ttl_ms` from now, and trim
-- the members scored at or below `trim_ms` (expired). A key of another type
-- under the index's name is foreign (nothing this release writes):
-- replaced, not an error on every fill of the group. Any other error (OOM
-- on a full server) stops the script here, before its first write: a DEL
-- first would let the script write on past the limit, with the group's
-- other members gone.
local function index_members(ik, members, ttl_ms, trim_ms)
  local added = redis.pcall('ZADD', ik, unpack(members))
  if type(added) ~= 'number' then
    if not string.find(added.err or '', 'WRONGTYPE', 1, true) then error(added) end
    redis.call('DEL', ik)
    added = redis.call('ZADD', ik, unpack(members))
  end
  -- Kept as long as its longest-lived member. NX gives a new index (no
  -- expiry yet) its own, and it holds nothing expired to trim; an older one
  -- (certainly older when no member was new: a refill) is trimmed and only
  -- ever extended (GT).
  if added == 0 or redis.call('PEXPIRE', ik, ttl_ms, 'NX') == 0 then
    redis.call('ZREMRANGEBYSCORE', ik, '-inf', trim_ms)
    redis.call('PEXPIRE', ik, ttl_ms, 'GT')
  end
end
