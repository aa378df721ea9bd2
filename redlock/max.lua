-- Raises the last-token record to the lease's token, the maximum over the
-- nodes that granted it, so that every later majority, which shares a node
-- with this one, issues a greater token.
-- KEYS[1] the last-token record, KEYS[2] the lock
-- ARGV[1] the token, ARGV[2] owner
-- Returns 1 when the record holds at least the token and the lock is still
-- the owner's, 0 when the lock is gone or another owner's (the record is
-- raised anyway: a token once issued is never issued again).
local rec = redis.call('GET', KEYS[1])
local token = tonumber(ARGV[1])
if not rec or not string.match(rec, '^%d+$') or tonumber(rec) < token then
  redis.call('SET', KEYS[1], ARGV[1])
end
if redis.call('GET', KEYS[2]) == ARGV[2] then
  return 1
end
return 0
