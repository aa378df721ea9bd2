-- Moves the lock's expiry if ARGV[1] still owns it.
-- KEYS[1] the lock; ARGV[1] owner, ARGV[2] lease ms
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
