-- Brings the expiry of the lock that ARGV[1] holds down to ARGV[2] ms from
-- now if it is later (LT), leaving a later-expiring lock of another owner,
-- or none, as it is: a waiting Acquire whose try found the lock its own
-- (granted to it) keeps it when replica sync refuses the try (see
-- Locker.tryOr), and that try set the lock's expiry to the lease time; a
-- waiter that died keeping it should hold the lock no longer than it would
-- have waited, as its grant did (grant.lua).
-- KEYS[1] the lock
-- ARGV[1] owner (its first 32 characters; the rest is its secret, see
-- acquire.lua), ARGV[2] ms
-- Returns 1 when the lock is the owner's, 0 when it is not.
if redis.call('GET', KEYS[1]) ~= string.sub(ARGV[1], 1, 32) then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2], 'LT')
return 1
