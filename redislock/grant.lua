-- Shared by acquire.lua and release.lua (scripts.go puts it in front of
-- each): the token arithmetic and the queue of waiters.
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
local function refuse(record, why)
  return redis.error_reply('FENCETOKEN token record ' .. record .. ' ' .. why)
end
local maxLast = '9007199254740990' -- 2^53 - 2: its successor is still exact

-- readLast returns the last token of record (nil: none), or nil and a
-- refusal when the record is not one this script can increase exactly.
local function readLast(record)
  local rec = redis.call('GET', record)
  if not rec then
    return nil
  end
  if not (rec == '0' or string.match(rec, '^[1-9]%d*$')) then
    return nil, refuse(record, string.format('holds %q, not a decimal integer', string.sub(rec, 1, 40)))
  end
  if #rec > #maxLast or (#rec == #maxLast and rec > maxLast) then
    return nil, refuse(record, 'holds ' .. string.sub(rec, 1, 40) .. ', at or past 2^53 - 1, beyond exact arithmetic')
  end
  return tonumber(rec)
end

-- The token floor is the server's clock in microseconds, so tokens keep
-- increasing when the record is lost (restart without persistence, eviction,
-- failover to a replica that missed it) or has expired. TIME cannot be
-- skipped when the record is present: a replica promoted after missing the
-- last writes holds an older, smaller record, and only the clock floor puts
-- the next token above the ones the lost primary handed out.
local function nextToken(record, last, now)
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if last and last >= token then
    token = last + 1
  end
  if token > 9007199254740991 then
    return nil, refuse(record, 'cannot be followed: the server clock reads ' .. now[1] .. ' s')
  end
  return token
end

local function clockMs(now)
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- The queue: lock .. ':queue' lists waiting owners in arrival order; the
-- waiter key lock .. ':waiter:' .. owner holds '<lease ms> <try> <secret>'
-- (the lease the owner asked for, the number of its last try that ran, the
-- secret that signs its grant) and lives for the owner's remaining wait
-- budget, so a waiter that died or gave up
-- drops out when its budget ends. An owner is live while its waiter key
-- exists and it is not revoked (lock .. ':revoked:' .. owner). These keys
-- share the lock's hash tag: on a cluster they are in its slot.

-- liveHead drops dead owners from the head of queue and returns the first
-- live one, with its waiter key's value, or nil.
local function liveHead(lock, queue)
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      return nil
    end
    local v = redis.call('GET', lock .. ':waiter:' .. head)
    if v and redis.call('EXISTS', lock .. ':revoked:' .. head) == 0 then
      return head, v
    end
    redis.call('LPOP', queue)
  end
end

-- grant gives the free lock to the live head of queue, with a new token,
-- for its lease or what is left of its wait budget if less (a waiter that
-- died holds the lock no longer than it would have waited), and tells it
-- on the release channel: 'g <owner> <token> <px> <try> <server ms> <mac>',
-- mac the SHA-1 of the secret and the four numbers before it, so that a
-- client that can publish but not read the keys cannot forge a grant.
-- It returns the owner granted (nil: no live waiter), or nil and a refusal
-- (the token record), leaving everything as it was.
local function grant(lock, record, queue, retention, publish, channel)
  while true do
    local head, v = liveHead(lock, queue)
    if not head then
      return nil
    end
    local waiter = lock .. ':waiter:' .. head
    local ms, try, secret = string.match(v, '^(%d+) (%d+) (%x+)$')
    local px = redis.call('PTTL', waiter)
    if ms and tonumber(ms) < px then
      px = tonumber(ms)
    end
    if ms and px > 0 then
      local last, err = readLast(record)
      if err then
        return nil, err
      end
      local now = redis.call('TIME')
      local token, terr = nextToken(record, last, now)
      if terr then
        return nil, terr
      end
      redis.call('LPOP', queue)
      redis.call('DEL', waiter)
      redis.call('SET', lock, head, 'PX', px)
      redis.call('SET', record, string.format('%d', token), 'PX', math.max(tonumber(retention), px))
      local signed = string.format('%d %d %s %d', token, px, try, clockMs(now))
      redis.call(publish, channel, 'g ' .. head .. ' ' .. signed .. ' ' .. redis.sha1hex(secret .. ' ' .. signed))
      return head
    end
    redis.call('LPOP', queue) -- malformed or expiring: not live
    redis.call('DEL', waiter)
  end
end
