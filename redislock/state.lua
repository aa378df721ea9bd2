#!lua flags=no-writes
-- Reads the lock's state for Status, changing nothing: the lock's PTTL and
-- the last-token record, in one step (a pipeline of PTTL and GET could
-- read them on either side of a release or a take).
-- KEYS[1] the lock, KEYS[2] the last-token record
--
-- A script rather than PTTL and GET, which go-redis and rueidis mark
-- read-only: a client that routes read-only commands to replicas sent
-- them to a replica, whose copy may be behind its primary or cut off from
-- it, and Status reported a lock just taken free, with last token 0.
-- EVALSHA is not read-only: every client sends it to the primary. A client
-- that sends every command to a replica (or a primary demoted by a
-- failover) gets READONLY, not the replica's word for its primary's: the
-- script asks the server its role. It declares no-writes: any other script
-- is refused as a write by a primary that refuses writes, for lack of
-- replicas (min-replicas-to-write: NOREPLICAS) or after a failed save
-- (MISCONF), and held back for as long as writes are paused (CLIENT PAUSE
-- WRITE, a switchover), which is when an operator reads the lock's state
-- (TestStatusOnPrimaryRefusingWrites, TestStatusDuringWritePause). Redis
-- runs such a script on a replica too: hence the role check. A server
-- that refuses INFO (an ACL user without it, INFO renamed) cannot be
-- asked, and the lock is read wherever the script runs, rather than not
-- at all (TestStatusWithoutInfo): such a user takes locks, and only a
-- client that sends every command to a replica then reads a replica's.
--
-- Returns {PTTL of the lock, the record or nil}.
local info = redis.pcall('INFO', 'replication')
if type(info) == 'string' and string.find(info, 'role:slave', 1, true) then
  return redis.error_reply("READONLY the lock's state read on a replica, which may be behind its primary")
end
return {redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
