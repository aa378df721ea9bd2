-- Shared by acquire.lua and release.lua (scripts.go puts it in each, with
-- grant.lua): the token arithmetic.
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
