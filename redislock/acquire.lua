-- Takes the lock if it is free and nobody queues for it, and issues a
-- fencing token, in one step (token.lua and grant.lua are put in this,
-- where its marker line is).
-- KEYS[1] the lock, KEYS[2] the last-token record, KEYS[3] the owner's
-- revocation mark (release.lua), KEYS[4] the queue of waiters, KEYS[5] the
-- waiters' hash (grant.lua)
-- ARGV[1] owner (32 characters) followed by the secret that signs a grant
-- to it (16), and by S when grants go out with SPUBLISH rather than
-- PUBLISH (B: with both; see publisher in grant.lua), ARGV[2] lease ms, ARGV[3] token record retention ms,
-- ARGV[4] how much longer the caller may wait, ms (0: it does not),
-- ARGV[5] the number of this try
-- The release channel is the lock's key followed by ':released' (not a
-- key; in the lock's slot by its hash tag, as SPUBLISH needs): made here,
-- on the rare path that grants, rather than sent with every call.
--
-- A try that finds the lock held by a caller that will wait queues the
-- caller (once: a later try refreshes its try number and deadline). The
-- release script grants the lock to the head of the queue and publishes
-- the grant; the waiter's subscription, confirmed after its try, sees it,
-- or was confirmed after it (then the waiter tries again at once and finds
-- the lock its own). A revoked owner does not queue.
--
-- A free lock with a live queued owner at the head that is not the caller
-- (its holder's lease ran out, nobody released it) is granted to that
-- owner, as a release would, and the caller finds it held: waiters get the
-- lock in the order they came, across processes.
--
-- Returns {1, token, server ms} when taken, {1, token, server ms, 1} when
-- already the caller's (a grant, or a retry whose reply was lost) with its
-- token, {0, holder's PTTL} when held,
-- and an error starting FENCETOKEN, leaving everything as it was, when the
-- record is not a token this script can increase exactly.
local lock, record, revoked, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner = string.sub(ARGV[1], 1, 32) -- the secret only when queued
local now -- TIME's reply, read once, when needed
-- Try the lock first: a held lock costs two calls, and a free one is taken
-- with no GET of it. What is refused below after taking it (a revoked owner,
-- a bad record) is undone with DEL in the same script, which runs
-- atomically and replicates its writes as one transaction: nobody sees the
-- lock taken, and the record is not touched.
local holder = redis.call('SET', lock, owner, 'NX', 'GET', 'PX', ARGV[2])
-- One EXISTS for the queue and the revocation mark, both absent on the
-- common path: the lock is then taken (or ours) with no more look at
-- either. Only when it counts one or more is each looked at on its own.
-- The count stays true where it is used: this script never makes a
-- revocation mark, and it adds to the queue only in enqueue, on the paths
-- that return right after.
local marks = 0
if not holder or holder == owner then
  marks = redis.call('EXISTS', queue, revoked)
end
if not holder and marks == 0 then
  -- The common path (a free lock, nobody queued, this owner not revoked):
  -- take(0) below, written out here so that it returns before any closure
  -- is made (token.lua's and this script's took about a tenth of its run,
  -- see bench/batching.md). Its checks are readLast's and nextToken's: a
  -- record or a clock that they would refuse goes on to take, which reads
  -- the record again and refuses it.
  local rec = redis.call('GET', record)
  if not rec or (rec == '0' or string.match(rec, '^[1-9]%d*$'))
    and (#rec < 16 or #rec == 16 and rec <= '9007199254740990') then -- token.lua's maxLast
    now = redis.call('TIME')
    local s, us = tonumber(now[1]), tonumber(now[2])
    local token = s * 1000000 + us
    local last = rec and tonumber(rec)
    if last and last >= token then
      token = last + 1
    end
    if token <= 9007199254740991 then
      redis.call('SET', record, string.format('%d', token), 'PX', ARGV[3])
      return {1, token, s * 1000 + math.floor(us / 1000)}
    end
  end
end
-- grant.lua --
local function clock()
  if not now then
    now = redis.call('TIME')
  end
  return now
end
-- keepLonger moves the expiry of lock, which owner holds, to ms from now,
-- never earlier (GT): a duplicate of the lease's own acquisition, run after
-- an Extend moved the lock further, would cut it below the holder's
-- deadline. It always writes: when GT leaves the expiry, the lock is set
-- again to its own value (KEEPTTL), so that the script is replicated and a
-- WAIT after it on the caller's connection counts the replicas that have
-- the lock as it is (a grant written by another connection included), not
-- an older write of that connection.
local function keepLonger(key, value, ms)
  if redis.call('PEXPIRE', key, ms, 'GT') == 0 then
    redis.call('SET', key, value, 'KEEPTTL')
  end
end
-- take hands out the token for a lock that was free (holder false: taken
-- now) or is already ours (a grant, or a retry), unless the record is bad
-- or, when marks (see above) counts anything, the owner is revoked.
local function take(marks)
  local last, err = readLast(record)
  if not err and marks > 0 and redis.call('EXISTS', revoked) == 1 then
    -- This acquisition was given up on before it ran: do not take the lock.
    err = {0, -2}
  end
  if err then
    if not holder then
      redis.call('DEL', lock)
    end
    return err
  end
  local ms = clockMs(clock())
  if holder and last then
    -- This owner already holds the lock (granted, or taken by a try whose
    -- reply was lost): hand out the same token with a fresh expiry, never
    -- an earlier one (GT): this may be a duplicate of the lease's own
    -- acquisition run after an Extend moved the lock further (see
    -- extend.lua), whose holder's deadline comes from that Extend.
    keepLonger(lock, owner, ARGV[2])
    return {1, last, ms, 1}
  end
  local token, terr = nextToken(record, last, clock())
  if terr then
    if not holder then
      redis.call('DEL', lock)
    end
    return terr
  end
  if holder then
    keepLonger(lock, owner, ARGV[2]) -- ours, but its token record was lost
  end
  redis.call('SET', record, string.format('%d', token), 'PX', ARGV[3])
  return {1, token, ms}
end
if marks == 0 and (not holder or holder == owner) then
  return take(0)
end
local function enqueue()
  local wait = tonumber(ARGV[4])
  if wait <= 0 or redis.call('EXISTS', revoked) == 1 then
    return
  end
  local deadline = clockMs(clock()) + wait
  if redis.call('HSET', waiters, owner, ARGV[2] .. ' ' .. ARGV[5] .. ' ' .. string.sub(ARGV[1], 33, 48) .. ' ' .. deadline) == 1 then
    redis.call('RPUSH', queue, owner)
    compact(queue, waiters, clockMs(clock()))
  end
  for _, k in ipairs({queue, waiters}) do
    if redis.call('PTTL', k) < wait then
      redis.call('PEXPIRE', k, wait)
    end
  end
end
if holder and holder ~= owner then
  enqueue()
  return {0, redis.call('PTTL', lock)}
end
if not holder and redis.call('EXISTS', queue) == 1 then
  -- Free: taken now, unless someone queued first.
  local head = liveHead(queue, waiters, clockMs(clock()))
  if head and head ~= owner then
    redis.call('DEL', lock)
    local _, err = grant(lock, record, queue, waiters, ARGV[3], publisher(ARGV[1]), lock .. ':released', clock())
    if err then
      return err
    end
    enqueue()
    return {0, redis.call('PTTL', lock)}
  end
  if head then
    redis.call('LPOP', queue)
    redis.call('HDEL', waiters, owner)
  end
end
return take(marks)
