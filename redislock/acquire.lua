-- Takes the lock if it is free and issues a fencing token, in one step.
-- KEYS[1] the lock, KEYS[2] the last-token record, KEYS[3] the owner's
-- revocation mark (release.lua), KEYS[4] the waiting mark
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] token record retention ms,
-- ARGV[4] how long the caller may wait, ms (0: it does not)
--
-- A try that finds the lock held by a caller that will wait sets the waiting
-- mark for as long as it may wait (never shortening one left by a longer
-- waiter); the release script publishes only while the mark is there. The
-- mark is set in the same step as the try, so a release after the try
-- publishes, and the waiter's subscription, confirmed after its try, sees
-- it or was confirmed after it (then the waiter tries again at once).
-- Returns {1, token, server ms} when taken, {0, holder's PTTL} when held,
-- and an error starting FENCETOKEN, leaving everything as it was, when the
-- record is not a token this script can increase exactly.
--
-- Lua numbers are doubles: integers are exact only up to 2^53. A record of
-- 9007199254740993 reads as 9007199254740992, and last + 1 then rounds back
-- to it (two holders, one token); near 2^63 the conversion to an integer
-- reply wraps to a negative number. Tokens made here never come close:
-- the floor is the server's clock in microseconds (about 1.8e15 now; it
-- reaches 2^53 - 1 in the year 2255), and each acquisition adds 1 to it. So a record
-- that is not a canonical decimal integer, or is 2^53 - 1 or more, was not
-- written by fence; rather than guess (ignoring it could go backwards,
-- rounding it could repeat a token), refuse and name the key.
local function refuse(why)
  return redis.error_reply('FENCETOKEN token record ' .. KEYS[2] .. ' ' .. why)
end
local maxLast = '9007199254740990' -- 2^53 - 2: its successor is still exact
-- Try the lock first: a held lock costs two calls, and a free one is taken
-- with no GET of it. What is refused below after taking it (a revoked owner,
-- a bad record) is undone with DEL in the same script, which runs
-- atomically and replicates its writes as one transaction: nobody sees the
-- lock taken, and the record is not touched.
local holder = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET', 'PX', ARGV[2])
if holder and holder ~= ARGV[1] then
  local wait = tonumber(ARGV[4])
  if wait > 0 and redis.call('PTTL', KEYS[4]) < wait then
    redis.call('SET', KEYS[4], '1', 'PX', wait)
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
-- Free (holder false: taken now) or already ours (a retry of this owner).
local function undo()
  if not holder then
    redis.call('DEL', KEYS[1])
  end
end
local last
local rec = redis.call('GET', KEYS[2])
if rec then
  if not (rec == '0' or string.match(rec, '^[1-9]%d*$')) then
    undo()
    return refuse(string.format('holds %q, not a decimal integer', string.sub(rec, 1, 40)))
  end
  if #rec > #maxLast or (#rec == #maxLast and rec > maxLast) then
    undo()
    return refuse('holds ' .. string.sub(rec, 1, 40) .. ', at or past 2^53 - 1, beyond exact arithmetic')
  end
  last = tonumber(rec)
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  -- This acquisition was given up on before it ran: do not take the lock.
  undo()
  return {0, -2}
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if holder and last then
  -- This acquisition already took the lock and its reply was lost (a
  -- timeout, a retry): hand out the same token with a fresh expiry.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, last, ms}
end
-- The token floor is the server's clock in microseconds, so tokens keep
-- increasing when the record is lost (restart without persistence, eviction,
-- failover to a replica that missed it) or has expired. TIME cannot be
-- skipped when the record is present: a replica promoted after missing the
-- last writes holds an older, smaller record, and only the clock floor puts
-- the next token above the ones the lost primary handed out.
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
if last and last >= token then
  token = last + 1
end
if token > 9007199254740991 then
  undo()
  return refuse('cannot be followed: the server clock reads ' .. now[1] .. ' s')
end
if holder then
  redis.call('PEXPIRE', KEYS[1], ARGV[2]) -- ours, but its token record was lost
end
redis.call('SET', KEYS[2], string.format('%d', token), 'PX', ARGV[3])
return {1, token, ms}
