-- KEYS: v fresh lock fence pass
-- ARGV: token fence mode value fresh_ms hard_ms channel key_hex fence_retention_ms pass_ms
-- The channel carries the entry's hash tag (same slot as KEYS on a cluster).
local f = tonumber(ARGV[2])
local hw = tonumber(redis.call('HGET', KEYS[4], 'hw') or '0')
local accepted = 0
if ARGV[3] ~= 'release' then
  if f >= hw then
    if ARGV[3] == 'store' then
      redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[6])
      if tonumber(ARGV[5]) > 0 then
        redis.call('SET', KEYS[2], '1', 'PX', ARGV[5])
      else
        redis.call('DEL', KEYS[2])
      end
      redis.call('DEL', KEYS[5])
    else
      -- The origin now says uncacheable: the old entry must not be served.
      redis.call('DEL', KEYS[1], KEYS[2])
      redis.call('SET', KEYS[5], '1', 'PX', ARGV[10])
    end
    redis.call('HSET', KEYS[4], 'hw', f)
    local keep = math.max(tonumber(ARGV[9]), tonumber(ARGV[6]))
    if redis.call('PTTL', KEYS[4]) < keep then redis.call('PEXPIRE', KEYS[4], keep) end
    accepted = 1
  else
    redis.call('HINCRBY', KEYS[4], 'rejected', 1)
  end
end
local released = 0
if redis.call('GET', KEYS[3]) == ARGV[1] then
  redis.call('DEL', KEYS[3])
  released = 1
end
-- Best effort: waiters also poll, and a server without sharded pub/sub
-- (before Redis 7) must not turn a stored entry into a failed write.
redis.pcall('SPUBLISH', ARGV[7], ARGV[8])
return {accepted, released}
