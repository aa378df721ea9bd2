-- Records ARGV[1] as the last accepted token in KEYS[1] if it is greater
-- than the stored one, and ARGV[2], the Accept call's id, in KEYS[2] for
-- ARGV[3] ms. Returns "" when accepted, else the stored token. Tokens are
-- compared as decimal strings without leading zeros (longer is greater),
-- which is exact over the whole int64 range; Lua numbers are not.
local last = redis.call('GET', KEYS[1])
if last and (#last > #ARGV[1] or (#last == #ARGV[1] and last >= ARGV[1])) then
  if last == ARGV[1] and redis.call('GET', KEYS[2]) == ARGV[2] then
    -- The same call sent again (the client resent it after losing the
    -- reply): it was accepted.
    return ''
  end
  return last
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return ''
