-- Takes the lock if it is free and issues a fencing token, in one step.
-- KEYS[1] the lock, KEYS[2] the last-token record
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] token record retention ms
-- Returns {1, token} when taken, {0, holder's PTTL} when held.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('PTTL', KEYS[1])}
end
-- The token floor is the server's clock in microseconds, so tokens keep
-- increasing when the record is lost (restart without persistence, eviction,
-- failover to a replica that missed it) or has expired.
local now = redis.call('TIME')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('GET', KEYS[2]))
if last and last >= token then
  token = last + 1
end
redis.call('SET', KEYS[2], string.format('%d', token), 'PX', ARGV[3])
return {1, token}
