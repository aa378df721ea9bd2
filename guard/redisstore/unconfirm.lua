-- Marks the call of a refused Accept (too few replicas acknowledged its
-- token) as unconfirmed: KEYS[1] must still hold ARGV[1] (the token) and
-- KEYS[2] exactly ARGV[2] .. ' ' .. ARGV[3] (this Accept call's own id and
-- the caller's call id), else nothing is changed (another Accept recorded
-- since, or a failover lost the record) and 0 is returned. The record
-- becomes ARGV[2] .. ' !' .. ARGV[3], keeping its expiry: the own id stays
-- (a go-redis resend of the accept script is still found), and a resend of
-- the caller's call is then answered "unconfirmed" by the accept script,
-- not "replayed": the call never ran. '!' is not a call id byte.
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('GET', KEYS[2]) ~= ARGV[2] .. ' ' .. ARGV[3] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2] .. ' !' .. ARGV[3], 'KEEPTTL')
return 1
