-- KEYS: down (present while some instance's breaker holds the origin down),
--       probe (the cluster's one probe slot)
-- ARGV: token, interval_ms
-- Elect one probe for the cluster per interval. Returns {2, 0} when no
-- instance holds the origin down (another probe found it back), {1, 0}
-- when this caller probes, {0, ms} while another probe's interval runs.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {2, 0}
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, 0}
end
return {0, redis.call('PTTL', KEYS[2])}
