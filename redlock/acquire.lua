-- Takes the lock on this node if it is free and issues this node's token for
-- the name, in one step.
-- KEYS[1] the lock, KEYS[2] the last-token record (no expiry), KEYS[3] the
-- try's revocation mark (release.lua)
-- ARGV[1] owner (one per try), ARGV[2] lease ms, ARGV[3] the client's
-- proposed floor, µs (its clock plus a second), ARGV[4] how far past this
-- node's clock the client's floor may count, µs
-- Returns {1, token, node ms} when taken, {0, holder's PTTL} when held (-2:
-- revoked; -3: held by this owner already, see below), and an error
-- starting FENCETOKEN, leaving the lock and the record as they were, when
-- the record is not a token this script can increase exactly.
--
-- The token is max(last + 1, T, min(the client's floor, T + ARGV[4])), T
-- being this node's clock in µs: the clock floors keep it increasing when
-- the record was lost (a restart without persistence). The client's floor,
-- a second ahead of its clock, is usually the largest: then every node that
-- has seen the same acquisitions answers the same token, and none needs the
-- token written back. Capped at T + 2 s, a client's clock far ahead cannot
-- push tokens further ahead of the nodes' clocks than that.
-- Lua numbers are doubles, exact below 2^53; a record at or past 2^53 - 1,
-- or not a canonical decimal integer, was not written by fence: refuse it.
--
-- The lock is tried first, with SET NX GET: a held lock costs two calls
-- (SET, PTTL), a free one five (SET, EXISTS of the mark, GET of the record,
-- TIME, SET of the record; the mark and the record read apart cost less
-- than one MGET of both, whose array reply becomes a Lua table).
-- What is refused after taking it (a revoked try, a bad record) is undone
-- with DEL in this same script, which runs atomically and replicates its
-- writes as one transaction: nobody sees the lock taken, and the record is
-- not touched.
local holder = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET', 'PX', ARGV[2])
if holder == ARGV[1] then
  -- This try's own lock (a try's owner is new each time): this node ran
  -- the try already. go-redis sends a command again (MaxRetries) when the
  -- connection failed before the reply was read, though the node ran it;
  -- or two clients given to New reach this one server (which New cannot
  -- always tell). Not a grant, which would count one server twice towards
  -- a majority; nor held by another owner, which left the lock there,
  -- taken by a try that failed, for its lease time: -3 tells the client
  -- that the lock is the try's, to give back if the try fails.
  return {0, -3}
end
if holder then
  -- Held by another owner.
  return {0, redis.call('PTTL', KEYS[1])}
end
local function refuse(why)
  redis.call('DEL', KEYS[1])
  return redis.error_reply('FENCETOKEN token record ' .. KEYS[2] .. ' ' .. why)
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  -- This try was given up on before it ran: do not take the lock.
  redis.call('DEL', KEYS[1])
  return {0, -2}
end
local maxLast = '9007199254740990'
local last
local rec = redis.call('GET', KEYS[2])
if rec then
  if not (rec == '0' or string.match(rec, '^[1-9]%d*$')) then
    return refuse(string.format('holds %q, not a decimal integer', string.sub(rec, 1, 40)))
  end
  if #rec > #maxLast or (#rec == #maxLast and rec > maxLast) then
    return refuse('holds ' .. string.sub(rec, 1, 40) .. ', at or past 2^53 - 1, beyond exact arithmetic')
  end
  last = tonumber(rec)
end
local now = redis.call('TIME')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
-- The client's floor counts only up to this node's clock plus ARGV[4] µs
-- (2 s): a client whose clock is hours ahead would otherwise push every
-- later token of the name hours ahead, on every node it reaches.
local floor = tonumber(ARGV[3])
if floor then
  floor = math.min(floor, token + tonumber(ARGV[4]))
  if floor > token then
    token = floor
  end
end
if last and last >= token then
  token = last + 1
end
if token > 9007199254740991 then
  return refuse('cannot be followed: the server clock reads ' .. now[1] .. ' s')
end
redis.call('SET', KEYS[2], string.format('%d', token))
return {1, token, tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)}
