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

-- The queue: a list of waiting owners in arrival order, and a hash of
-- each one's '<lease ms> <try> <secret> <deadline>': the lease it asked
-- for, the number of its last try that ran, the secret that signs its
-- grant, and the end of its wait budget on the server's clock (ms). An
-- owner is live while its field is there and its deadline has not passed:
-- a waiter that died or gave up without withdrawing drops out when its
-- budget ends. Both keys are the scripts' declared keys, in the lock's
-- slot, so a slot migration redirects the scripts rather than fail them.

-- liveHead drops dead owners from the head of queue and returns the first
-- live one with its lease ms, try, secret and deadline, or nil.
local function liveHead(queue, waiters, nowMs)
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      return nil
    end
    local v = redis.call('HGET', waiters, head)
    if v then
      local ms, try, secret, dl = string.match(v, '^(%d+) (%d+) (%x+) (%d+)$')
      if ms and tonumber(dl) > nowMs then
        return head, tonumber(ms), try, secret, tonumber(dl)
      end
    end
    redis.call('LPOP', queue)
    redis.call('HDEL', waiters, head)
  end
end

-- compact rebuilds queue from its live owners, in order, once it holds
-- more than twice as many ids as waiters has entries: a waiter that
-- withdraws leaves only its hash entry, and its id stays in the list until
-- it reaches the head. Under a holder that keeps the lock while waiters
-- come and give up, the list would grow for as long as it is held (and
-- the release would walk it in one script). Rebuilding when half of it is
-- dead costs O(1) per enqueue, amortized; the list keeps its expiry.
local function compact(queue, waiters, nowMs)
  local n = redis.call('LLEN', queue)
  if n <= 2 * redis.call('HLEN', waiters) + 16 then
    return
  end
  local ttl = redis.call('PTTL', queue)
  local live, seen = {}, {}
  for _, o in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    if not seen[o] then
      seen[o] = true
      local v = redis.call('HGET', waiters, o)
      local dl = v and string.match(v, ' (%d+)$')
      if dl and tonumber(dl) > nowMs then
        live[#live + 1] = o
      elseif v then
        redis.call('HDEL', waiters, o)
      end
    end
  end
  redis.call('DEL', queue)
  for i = 1, #live, 1000 do
    redis.call('RPUSH', queue, unpack(live, i, math.min(i + 999, #live)))
  end
  if #live > 0 and ttl > 0 then
    redis.call('PEXPIRE', queue, ttl)
  end
end

-- grant gives the free lock to the live head of queue, with a new token,
-- for its lease or what is left of its wait budget if less (a waiter that
-- died holds the lock no longer than it would have waited), and tells it
-- on the release channel: 'g <owner> <token> <px> <try> <server ms> <mac>',
-- mac the SHA-1 of the secret and the four numbers before it, so that a
-- client that can publish but not read the keys cannot forge a grant.
-- now is TIME's reply. It returns the owner granted (nil: no live waiter),
-- or nil and a refusal (the token record), leaving everything as it was.
local function grant(lock, record, queue, waiters, retention, publish, channel, now)
  local nowMs = clockMs(now)
  local head, ms, try, secret, dl = liveHead(queue, waiters, nowMs)
  if not head then
    return nil
  end
  local px = math.min(ms, dl - nowMs)
  local last, err = readLast(record)
  if err then
    return nil, err
  end
  local token, terr = nextToken(record, last, now)
  if terr then
    return nil, terr
  end
  redis.call('LPOP', queue)
  redis.call('HDEL', waiters, head)
  redis.call('SET', lock, head, 'PX', px)
  redis.call('SET', record, string.format('%d', token), 'PX', math.max(tonumber(retention), px))
  local signed = string.format('%d %d %s %d', token, px, try, nowMs)
  redis.call(publish, channel, 'g ' .. head .. ' ' .. signed .. ' ' .. redis.sha1hex(secret .. ' ' .. signed))
  return head
end
