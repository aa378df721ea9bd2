-- Records ARGV[1] as the last accepted token in KEYS[1] if it is greater
-- than the stored one. Returns "" when accepted, else the stored token.
-- Tokens are compared as decimal strings without leading zeros (longer is
-- greater), which is exact over the whole int64 range; Lua numbers are not.
local last = redis.call('GET', KEYS[1])
if last and (#last > #ARGV[1] or (#last == #ARGV[1] and last >= ARGV[1])) then
  return last
end
redis.call('SET', KEYS[1], ARGV[1])
return ''
