-- Records ARGV[1] as the last accepted token in KEYS[1] if it is greater
-- than the stored one, and in KEYS[2], for ARGV[3] ms, ARGV[2] (this
-- Accept call's own id) and ARGV[4] (the caller's call id, see
-- guard.WithCall, or ""), separated by a space. Returns "" when accepted
-- (or when this same Accept call is seen again), "replayed" when the
-- caller's call id is the one recorded with the same token, else the
-- stored token. Tokens are compared as decimal strings without leading
-- zeros (longer is greater), which is exact over the whole int64 range;
-- Lua numbers are not.
local last = redis.call('GET', KEYS[1])
if last and (#last > #ARGV[1] or (#last == #ARGV[1] and last >= ARGV[1])) then
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
    end
  end
  return last
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2] .. ' ' .. ARGV[4], 'PX', ARGV[3])
return ''
