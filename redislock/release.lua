-- Deletes the lock if ARGV[1] still owns it and tells waiters, if any
-- (acquire.lua sets the waiting mark while someone may wait).
-- KEYS[1] the lock, KEYS[2] the waiting mark, KEYS[3] (when revoking) the
-- owner's revocation mark
-- ARGV[1] owner, ARGV[2] PUBLISH or SPUBLISH, ARGV[3] the release channel
-- (not a key; in the lock's slot by its hash tag, as SPUBLISH needs),
-- ARGV[4] (when revoking) how long the mark lives, ms
-- Revoking gives up an acquisition whose reply was lost: it may not have run
-- yet (sitting in a paused server's socket). The mark makes the acquire
-- script refuse that owner if it runs later, so the lock is freed whichever
-- of the two runs first. It is left even when this run deletes the lock: a
-- waiting Acquire retries with the same owner, so another of its acquire
-- scripts may still be on its way, on another connection.
if ARGV[4] then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[4])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call(ARGV[2], ARGV[3], 'released')
  end
  return 1
end
return 0
