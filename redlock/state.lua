#!lua flags=no-writes
-- Reads one node's state of the lock for Status, changing nothing: the
-- lock's PTTL and the last-token record, in one step.
-- KEYS[1] the lock, KEYS[2] the last-token record
--
-- A script rather than PTTL and GET, which go-redis marks read-only: a node
-- client that routes read-only commands to replicas (a cluster client over
-- a primary and its replicas, as redis.NewFailoverClusterClient builds one,
-- with ReadOnly or RouteRandomly) sent them to a replica, which may be
-- behind its primary or cut off from it, and Status reported the lock the
-- node had just granted free (TestStatusOnReplicaRoutingNode). A script is
-- sent to the primary. One that reaches a replica anyway (a client that
-- sends every command there) gets READONLY rather than the replica's copy:
-- the script asks the server its role, unless INFO is refused (an ACL user
-- without it), and then reads wherever it runs. It declares no-writes, so
-- that a primary refusing or pausing writes (min-replicas-to-write, a
-- failed save, CLIENT PAUSE WRITE) still answers it, as redislock's
-- state.lua does.
--
-- Returns {PTTL of the lock, the record or nil}.
local info = redis.pcall('INFO', 'replication')
if type(info) == 'string' and string.find(info, 'role:slave', 1, true) then
  return redis.error_reply("READONLY the lock's state read on a replica, which may be behind its primary")
end
return {redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
