-- Shared by acquire.lua and release.lua (scripts.go puts it in each, after
-- token.lua, where their marker line is, so that their common paths return
-- before these closures are made): the queue of waiters.
--
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

-- publisher returns the commands that publish on the release channel:
-- SPUBLISH when the owner argument (32 characters of owner, 16 of secret)
-- ends with S (the Locker is on a cluster), both PUBLISH and SPUBLISH when
-- it ends with B (a client the Locker cannot identify, which may hide a
-- cluster client: its waiters subscribe both ways, and the waiters of a
-- cluster client's Lockers with SSUBSCRIBE only), PUBLISH otherwise.
local function publisher(ownerArg)
  local b = string.byte(ownerArg, 49)
  if b == 83 then -- 'S'
    return {'SPUBLISH'}
  elseif b == 66 then -- 'B'
    return {'PUBLISH', 'SPUBLISH'}
  end
  return {'PUBLISH'}
end

-- publishAll publishes msg on channel with each of publish's commands.
-- B's SPUBLISH, after its PUBLISH, may be refused (an ACL user allowed
-- PUBLISH and not SPUBLISH, as one written before Redis 7): redis.call
-- would then end the script with an error after its writes (a grant
-- made and published, the caller told it failed), where PUBLISH alone
-- served (TestOpaqueClientWithoutShardedPubSub).
local function publishAll(publish, channel, msg)
  for i, cmd in ipairs(publish) do
    if i == 1 then
      redis.call(cmd, channel, msg)
    else
      redis.pcall(cmd, channel, msg)
    end
  end
end

-- grant gives the free lock to the live head of queue, with a new token,
-- for its lease or what is left of its wait budget if less (a waiter that
-- died holds the lock no longer than it would have waited), and tells it
-- on the release channel: 'g <owner> <token> <px> <try> <server ms> <mac>',
-- mac the SHA-1 of the secret and the four numbers before it, so that a
-- client that can publish but not read the keys cannot forge a grant.
-- now is TIME's reply. It returns the owner granted and its token (nil: no
-- live waiter), or nil and a refusal (the token record), leaving everything
-- as it was.
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
  publishAll(publish, channel, 'g ' .. head .. ' ' .. signed .. ' ' .. redis.sha1hex(secret .. ' ' .. signed))
  return head, nil, token
end
