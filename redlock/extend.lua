-- Moves the lock's expiry on this node if ARGV[1] still owns it and the
-- lease has not ended yet by its holder's clock.
-- KEYS[1] the lock
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] the lease's deadline in this
-- node's ms (mapped from the holder's clock through an earlier reply of this
-- node, erring early), or 0 when the holder has no such reply yet
-- Returns {1, node ms} when moved, {0, node ms} when the lock is gone or
-- another owner's, {-1, node ms} when the renewal came after the deadline
-- (or, with ARGV[3] 0, when the lock is the owner's but was not moved).
--
-- A renewal can sit in a paused node's socket past the lease's deadline;
-- run then, a plain PEXPIRE would hold the lock there for a full lease that
-- nobody uses (the holder gave up at its deadline). Such a renewal is
-- refused, and the lock expires when it would have.
--
-- The expiry only moves later (GT): a renewal with a short lease that was
-- held up on its way, given up on by its holder and overtaken by one with a
-- longer lease, would otherwise cut the expiry below the deadline the
-- holder has from the newer one, and other owners could take the lock
-- inside it. Asked for an expiry earlier than the lock has, the script
-- leaves it and answers moved: the lock is held at least that long.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, now}
end
if now > tonumber(ARGV[3]) then
  return {-1, now}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
return {1, now}
