-- Deletes the lock on this node if ARGV[1] still owns it.
-- KEYS[1] the lock, KEYS[2] (when revoking) the owner's revocation mark,
-- KEYS[3] (when revoking a lease's late node) the last-token record
-- ARGV[1] owner, ARGV[2] (when revoking) how long the mark lives, ms,
-- ARGV[3] (with KEYS[3]) the lease's token
-- Returns 1 when it deleted the lock, 0 when the lock was not the owner's;
-- when revoking, -1 when another owner holds it (the node is not free).
-- Revoking gives up a try whose reply did not come in time: it may not have
-- run yet (sitting in a paused node's socket). The mark makes the acquire
-- script refuse that owner if it runs later, so the node is freed whichever
-- of the two runs first.
-- A lease's release revokes the nodes whose grant had not come with the
-- lease's token too: if the acquisition ran there, it issued a token of its
-- own, possibly smaller, that the write-back did not raise (max.lua); left
-- so, a later majority of this node and a node that lost its record would
-- issue a token smaller than the lease's.
if ARGV[2] then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
end
if ARGV[3] then
  local rec = redis.call('GET', KEYS[3])
  if not rec or not string.match(rec, '^%d+$') or tonumber(rec) < tonumber(ARGV[3]) then
    redis.call('SET', KEYS[3], ARGV[3])
  end
end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if ARGV[2] and holder then
  return -1
end
return 0
