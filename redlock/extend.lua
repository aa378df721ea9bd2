-- Moves the lock's expiry on this node if ARGV[1] still owns it.
-- KEYS[1] the lock
-- ARGV[1] owner, ARGV[2] lease ms
-- Returns 1 when moved, 0 when the lock is gone or another owner's.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
