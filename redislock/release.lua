-- Deletes the lock if ARGV[1] still owns it and grants it to the live head
-- of the queue, if any, telling it on the release channel (grant.lua is
-- put in this, where its marker line is). Replies 0 (not the owner's), 1
-- (deleted), or {1, owner, token} (deleted and granted to owner).
-- KEYS[1] the lock, KEYS[2] the last-token record, KEYS[3] the queue,
-- KEYS[4] the waiters' hash, KEYS[5] the waiting mark of older versions,
-- KEYS[6] the owner's revocation mark, KEYS[7] the owner whose release
-- last deleted the lock (see below)
-- ARGV[1] owner (its first 32 characters; then its secret, and S when
-- grants go out with SPUBLISH rather than PUBLISH, B with both), ARGV[2] token record
-- retention ms, ARGV[3] (when withdrawing) how long the revocation mark
-- lives, ms (0: no mark; -1: not withdrawing), ARGV[4] (a lease's release,
-- not a give-back) 1
-- The release channel is the lock's key followed by ':released' (not a
-- key; in the lock's slot by its hash tag, as SPUBLISH needs), made only
-- when something is published rather than sent with every call.
--
-- Withdrawing (ARGV[3] given, not -1) also takes the owner out of the queue: a
-- waiter that leaves without a lease, or an acquisition given up on.
-- Revoking gives up an acquisition whose reply was lost: it may not have run
-- yet (sitting in a paused server's socket). The mark makes the acquire
-- script refuse that owner if it runs later, so the lock is freed whichever
-- of the two runs first. It is left even when this run deletes the lock: a
-- waiting Acquire retries with the same owner, so another of its acquire
-- scripts may still be on its way, on another connection.
--
-- A release whose reply was lost with its connection is sent again by the
-- client (go-redis's MaxRetries), and that run finds the lock gone, or
-- granted already to the next waiter. A lease's release (ARGV[4]) that
-- deletes the lock therefore renames it to KEYS[7], which keeps its owner
-- for what was left of its expiry: a run that finds the lock not its
-- owner's but that record its own replies 1, as the first run did. Owners
-- are unique, so no other lease's release can match it. The record, one
-- per lock overwritten by each release, costs no memory per release, and
-- the RENAME about 1 us of the server's time more than a DEL (a SET with
-- its own expiry, about 1.8). Give-backs neither
-- record nor read it: their owner may take the lock again (a waiter that
-- gave back a grant its replicas refused), and a lease of that owner
-- lost later must not be told released by an old record.
--
-- Waiters of versions before the queue set the waiting mark instead; with
-- no live queued waiter, a release publishes 'released' for them while
-- the mark is there. A token record the grant cannot increase leaves the
-- lock free and publishes 'released': the waiters try, and are refused.
local lock, record, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner = string.sub(ARGV[1], 1, 32)
if ARGV[3] and ARGV[3] ~= '-1' then
  if tonumber(ARGV[3]) > 0 then
    redis.call('SET', KEYS[6], '1', 'PX', ARGV[3])
  end
  redis.call('HDEL', waiters, owner)
end
if redis.call('GET', lock) ~= owner then
  if ARGV[4] and redis.call('GET', KEYS[7]) == owner then
    return 1
  end
  return 0
end
-- A user whose ACL lists commands one by one, written before the record,
-- may be denied RENAME: the lock is deleted all the same, without the
-- record, as before it (redis.call would end the script there, and the
-- lock stayed held by nobody for its lease time:
-- TestReleaseAsUserDeniedRename).
if not ARGV[4] or redis.pcall('RENAME', lock, KEYS[7]).err then
  redis.call('DEL', lock)
end
-- One EXISTS for the queue and the waiting mark, both absent on the common
-- path: only when it counts one or more is each looked at, with grant.lua's
-- helpers, which scripts.go puts below, so that the common path returns
-- before it makes their closures (their making is about a tenth of this
-- script's run on that path).
if redis.call('EXISTS', queue, KEYS[5]) == 0 then
  return 1
end
-- grant.lua --
local publish = publisher(ARGV[1])
local granted, err, token
if redis.call('EXISTS', queue) == 1 then
  granted, err, token = grant(lock, record, queue, waiters, ARGV[2], publish, lock .. ':released', redis.call('TIME'))
end
if err or (not granted and redis.call('EXISTS', KEYS[5]) == 1) then
  publishAll(publish, lock .. ':released', 'released')
end
if granted then
  return {1, granted, token} -- whom it granted: see Locker.releaseLease
end
return 1
