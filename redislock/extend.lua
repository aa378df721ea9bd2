-- Moves the lock's expiry if ARGV[1] still owns it and the lease has not
-- ended yet by its holder's clock.
-- KEYS[1] the lock
-- ARGV[1] owner (its first 32 characters; the rest is its secret, see
-- acquire.lua), ARGV[2] lease ms, ARGV[3] the lease's deadline, in this
-- server's ms (the holder's deadline plus the largest offset between the
-- clocks that it measured)
-- Returns {1, server ms} when moved, {0, server ms} when the lock is gone or
-- another owner's, {-1, server ms} when the renewal came after the deadline.
--
-- A renewal can sit in a paused server's socket past the lease's deadline;
-- run then, a plain PEXPIRE would hold the lock for a full lease that nobody
-- uses (the holder gave up at its deadline). Such a renewal is refused, and
-- the lock expires when it would have.
--
-- The expiry only moves later (GT): a renewal with a short lease that was
-- held up on its way, given up on by its holder and overtaken by one with a
-- longer lease, would otherwise cut the expiry below the deadline the
-- holder has from the newer one, and another owner could take the lock
-- inside it. Asked for an expiry earlier than the lock has, the script
-- leaves it and answers moved: the lock is held at least that long.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('GET', KEYS[1]) ~= string.sub(ARGV[1], 1, 32) then
  return {0, now}
end
if now > tonumber(ARGV[3]) then
  return {-1, now}
end
if redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT') == 0 then
  -- Left as it was: write the lock again (KEEPTTL) all the same, so that
  -- this script is replicated and a WAIT after it counts the replicas that
  -- have the lock's expiry as it is, not an older write of the caller's
  -- connection.
  redis.call('SET', KEYS[1], string.sub(ARGV[1], 1, 32), 'KEEPTTL')
end
return {1, now}
