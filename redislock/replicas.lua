-- Reads this primary's replication state and the expected replica count
-- recorded on the primary itself, so that every client of it, in any
-- process, expects the replicas that any of them has seen.
-- KEYS[1] the record: "<master_replid> <count>", without expiry
-- ARGV[1] "raise": raise the record to the connected count;
--         "read": change nothing;
--         "set": replace the count with ARGV[2]
-- A record of another replication id was written before a failover (or by
-- another primary) and no longer applies: it counts as absent.
-- Returns {expected, connected, replid}, or an error naming the key when the
-- record is not one fence wrote.
local info = redis.call('INFO', 'replication')
local connected = tonumber(string.match(info, 'connected_slaves:(%d+)')) or 0
local replid = string.match(info, 'master_replid:(%w+)') or ''
local rec = redis.call('GET', KEYS[1])
local recorded = nil
if rec then
  local id, n = string.match(rec, '^(%w+) (%d+)$')
  if not id or #n > 6 then
    return redis.error_reply('FENCEREPLICAS ' .. KEYS[1] .. ' holds ' .. string.format('%q', string.sub(rec, 1, 64)) ..
      ', not "<master_replid> <count>"; set it with SetExpectedReplicas or delete it')
  end
  if id == replid then
    recorded = tonumber(n)
  end
end
local expected = math.max(connected, recorded or 0)
if ARGV[1] == 'set' then
  expected = tonumber(ARGV[2])
end
-- A server that does not state its replication id gets no record.
if ARGV[1] ~= 'read' and replid ~= '' and expected ~= recorded and (rec or expected > 0) then
  redis.call('SET', KEYS[1], replid .. ' ' .. expected)
end
return {expected, connected, replid}
