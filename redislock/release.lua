-- Deletes the lock if ARGV[1] still owns it and tells waiters.
-- KEYS[1] the lock, KEYS[2] the release channel
-- ARGV[1] owner, ARGV[2] PUBLISH or SPUBLISH
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[2], KEYS[2], 'released')
  return 1
end
return 0
