-- Deletes the lock on this node if ARGV[1] still owns it.
-- KEYS[1] the lock, KEYS[2] (when revoking) the owner's revocation mark
-- ARGV[1] owner, ARGV[2] (when revoking) how long the mark lives, ms
-- Revoking gives up a try whose reply did not come in time: it may not have
-- run yet (sitting in a paused node's socket). The mark makes the acquire
-- script refuse that owner if it runs later, so the node is freed whichever
-- of the two runs first.
if ARGV[2] then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
