-- KEYS: down (while some instance's breaker holds the origin down: the
--       cluster's probe interval, ms), probe (the cluster's one probe slot)
-- ARGV: token, first_ms (the interval if down holds no number)
-- Elect one probe for the cluster per interval. Returns {2, 0} when no
-- instance holds the origin down (another probe found it back), {1, ms}
-- when this caller probes (ms: the interval it stands for), {0, ms} while
-- another probe's interval runs (ms left).
local interval = redis.call('GET', KEYS[1])
if not interval then
  return {2, 0}
end
interval = tonumber(interval) or tonumber(ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[1]
    or redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', interval) then
  return {1, interval}
end
return {0, redis.call('PTTL', KEYS[2])}
