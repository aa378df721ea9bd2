-- Records ARGV[1] as the last accepted token in KEYS[1] if it is greater
-- than the stored one, and in KEYS[2], for ARGV[3] ms, ARGV[2] (this
-- Accept call's own id) and ARGV[4] (the caller's call id, see
-- guard.WithCall, or ""), separated by a space. Returns "" when accepted
-- (or when this same Accept call is seen again), "replayed" when the
-- caller's call id is the one recorded with the same token,
-- "unconfirmed" when it is recorded with the same token but marked
-- refused ('!' before it, see unconfirm.lua), else the stored token. Tokens are compared as decimal strings without leading
-- zeros (longer is greater), which is exact over the whole int64 range;
-- Lua numbers are not.
--
-- With KEYS[3], the store's floor (Store.ClockTokens): when KEYS[1] is
-- missing, the token must be greater than the floor, which is created
-- when missing (no expiry) as the server's TIME in µs plus ARGV[5] µs.
-- Returns "floor " .. the floor when it is not, "allkeys " .. the policy
-- when maxmemory-policy is an allkeys one (a record evicted while the
-- floor stays would go unseen), "noinfo " .. the error when INFO was
-- refused (the policy unknown), and an error starting FENCEFLOOR when the
-- floor is not a decimal integer this script wrote; nothing is recorded
-- then. With ARGV[6] not '0' (Store.MaxAhead, µs), a token to be recorded
-- above TIME plus ARGV[6] is refused: "ahead " .. that limit.
local function greater(a, b)
  return #a > #b or (#a == #b and a > b)
end
local last = redis.call('GET', KEYS[1])
if last and not greater(ARGV[1], last) then
  if last == ARGV[1] then
    local rec = redis.call('GET', KEYS[2])
    if rec then
      local own, call = rec, ''
      local sep = string.find(rec, ' ', 1, true)
      if sep then
        own, call = string.sub(rec, 1, sep - 1), string.sub(rec, sep + 1)
      end
      if own == ARGV[2] then
        -- The same Accept sent again (go-redis resent it after losing
        -- the reply): it was accepted.
        return ''
      end
      if ARGV[4] ~= '' and call == ARGV[4] then
        -- Another Accept of the caller's call (an HTTP resend): it was
        -- accepted before; the caller must not do the work again.
        return 'replayed'
      end
      if ARGV[4] ~= '' and call == '!' .. ARGV[4] then
        -- The caller's call was refused for too few replica
        -- acknowledgements (see unconfirm.lua): it never ran, and its
        -- token stays spent.
        return 'unconfirmed'
      end
    end
  end
  return last
end
if KEYS[3] and ARGV[6] ~= '0' then
  -- Store.MaxAhead: a token to be recorded must not be above the clock
  -- plus ARGV[6] µs (a forged one would block the resource for good).
  local now = redis.call('TIME')
  local limit = string.format('%d', tonumber(now[1]) * 1000000 + tonumber(now[2]) + tonumber(ARGV[6]))
  if greater(ARGV[1], limit) then
    return 'ahead ' .. limit
  end
end
if not last and KEYS[3] then
  -- Only here, where a record is missing (a new resource, or a lost
  -- record), is the eviction policy read: under allkeys-* a record can
  -- be evicted while the floor, read on every such call, stays.
  local info = redis.pcall('INFO', 'memory')
  if type(info) ~= 'string' then
    -- Refused (an ACL user without @dangerous): the policy is unknown.
    return 'noinfo ' .. tostring(info.err or info)
  end
  local policy = string.match(info, 'maxmemory_policy:(allkeys%-[%w-]+)')
  if policy then
    return 'allkeys ' .. policy
  end
  local floor = redis.call('GET', KEYS[3])
  if not floor then
    local now = redis.call('TIME')
    floor = string.format('%d', tonumber(now[1]) * 1000000 + tonumber(now[2]) + tonumber(ARGV[5]))
    redis.call('SET', KEYS[3], floor)
  elseif not string.match(floor, '^[1-9]%d*$') or #floor > 19 then
    return redis.error_reply('FENCEFLOOR the floor key holds ' .. string.format('%q', string.sub(floor, 1, 40)) .. ', not a token floor written by fence')
  end
  if not greater(ARGV[1], floor) then
    return 'floor ' .. floor
  end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2] .. ' ' .. ARGV[4], 'PX', ARGV[3])
return ''
