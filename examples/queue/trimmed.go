package queue

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/bound"
	"github.com/redis/go-redis/v9"
)

// claimScript runs XAUTOCLAIM on the stream KEYS[1] for group ARGV[1],
// consumer ARGV[2], min-idle ARGV[3] ms, from cursor ARGV[4], COUNT ARGV[5],
// and returns its cursor and entries with the ids in the set KEYS[2]. To
// that set it first adds the ids XAUTOCLAIM reports as deleted: entries
// pending in the group that were trimmed from the stream (XTRIM, XADD
// MAXLEN or MINID, XDEL) before anyone acknowledged them. Redis (7 and
// later) tells of each once, in XAUTOCLAIM's third reply element (which
// go-redis's XAutoClaim discards), and takes it off the pending list: kept
// in the set, in the same script, an id is not lost if the consumer stops
// or the database fails before it is recorded (see recordTrimmed), and it
// leaves the set only once recorded. KEYS[2] shares the stream's hash tag,
// so that both keys are in one Redis Cluster slot.
var claimScript = redis.NewScript(`
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
for _, id in ipairs(r[3] or {}) do
  redis.call('SADD', KEYS[2], id)
end
return {r[1], r[2], redis.call('SMEMBERS', KEYS[2])}
`)

// refused reports whether err is the server's refusal of the claim
// script, or of a command in it, to the consumer's ACL user.
func refused(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "user executing the script can't run this command")
}

// trimmedKey is the set of the group's pending entries trimmed from the
// stream and not yet recorded (see claimScript): in the stream's hash slot.
func (c *Consumer) trimmedKey() string { return "{" + c.Stream + "}:trimmed:" + c.Group }

// claimReply is claimScript's reply.
type claimReply struct {
	claimed []redis.XMessage
	next    string
	trimmed []string
}

// parseClaim reads claimScript's reply v: the cursor, the entries (each an
// id and its fields, as XAUTOCLAIM gives them), the trimmed ids.
func parseClaim(v any) (claimReply, error) {
	var r claimReply
	parts, ok := v.([]any)
	if !ok || len(parts) != 3 {
		return r, fmt.Errorf("queue: claim script replied %v", v)
	}
	entries, ok1 := parts[1].([]any)
	trimmed, ok2 := parts[2].([]any)
	if r.next, ok = parts[0].(string); !ok || !ok1 || !ok2 {
		return r, fmt.Errorf("queue: claim script replied %v", v)
	}
	for _, e := range entries {
		pair, ok := e.([]any)
		if !ok || len(pair) != 2 {
			return r, fmt.Errorf("queue: claim script replied entry %v", e)
		}
		id, ok1 := pair[0].(string)
		fields, ok2 := pair[1].([]any)
		if !ok1 || !ok2 || len(fields)%2 != 0 {
			return r, fmt.Errorf("queue: claim script replied entry %v", e)
		}
		m := redis.XMessage{ID: id, Values: make(map[string]any, len(fields)/2)}
		for i := 0; i < len(fields); i += 2 {
			k, _ := fields[i].(string)
			m.Values[k] = fields[i+1]
		}
		r.claimed = append(r.claimed, m)
	}
	for _, id := range trimmed {
		s, ok := id.(string)
		if !ok {
			return r, fmt.Errorf("queue: claim script replied trimmed id %v", id)
		}
		r.trimmed = append(r.trimmed, s)
	}
	return r, nil
}

// recordTrimmed records in queue_dead the pending entry id that was
// trimmed from the stream before it was applied (see claimScript), unless
// it is done (applied, then trimmed before its XACK; or recorded before),
// then takes it out of the set of trimmed ids. Its fields are gone with
// the entry, its message id with them: the dead letter is keyed by the
// entry id, as an entry without a message id is, and fenced on that key's
// resource, so that a deposed leader applying such an entry (read before
// the trim) and this record do not both land. An error (the database or
// Redis failing, the fence refusing a newer leader's) ends the term; the
// id stays in the set, for the next claim. ctx is the lease's, run is
// Run's (see apply).
func (c *Consumer) recordTrimmed(ctx, run context.Context, lease fence.Lease, id string) error {
	if err := valid(ctx, lease); err != nil {
		return err
	}
	token := lease.Token()
	cause := fmt.Errorf("queue: entry %s was trimmed from stream %q before it was applied: its fields, and its message id, are gone", id, c.Stream)
	rctx, cancel := context.WithTimeout(run, cmp.Or(c.TxTimeout, DefaultTxTimeout))
	defer cancel()
	err := c.fenced()(rctx, c.DB, Resource(c.Stream, id), token, func(tx *sql.Tx) error {
		if done, err := c.entryDone(rctx, tx, id); err != nil || done {
			return cmp.Or(err, errDuplicate)
		}
		_, err := tx.ExecContext(rctx, `INSERT INTO queue_dead (stream, msg_id, entry_id, fields, deliveries, error, token, consumer)
VALUES ($1, $2, $2, '', 0, $3, $4, $5) ON CONFLICT (stream, msg_id) DO NOTHING`,
			c.Stream, id, cause.Error(), int64(token), c.Name)
		return err
	})
	// The leader's own token refused: this term applied or recorded the
	// entry already (see doneBefore).
	var stale *guard.StaleError
	if errors.As(err, &stale) && stale.Last == token {
		if done, derr := c.entryDone(rctx, c.DB, id); derr == nil && done {
			err = errDuplicate
		}
	}
	switch {
	case errors.Is(err, errDuplicate):
		c.log().Info(LogDuplicate, "consumer", c.Name, "id", id, "token", int64(token))
	case errors.Is(err, guard.ErrStale):
		c.log().Warn(LogRejected, "consumer", c.Name, "id", id, "token", int64(token), "err", err)
		return fmt.Errorf("%w: queue: a newer leader had trimmed entry %s: %w", fence.ErrLeaseLost, id, err)
	case err != nil:
		c.log().Warn(LogFailed, "consumer", c.Name, "id", id, "token", int64(token), "err", err)
		return fmt.Errorf("queue: record trimmed entry %s: %w", id, err)
	default:
		c.log().Error(LogDead, "consumer", c.Name, "id", id, "token", int64(token), "deliveries", 0, "err", cause)
	}
	_, err = bound.Call(rctx, func() (int64, error) { return c.Redis.SRem(rctx, c.trimmedKey(), id).Result() }, nil)
	if err != nil {
		return fmt.Errorf("queue: SREM %s: %w", id, err)
	}
	return nil
}

// entryDone reports whether stream entry id is done: in queue_applied or
// queue_dead by its entry id, or by its key for a row from before
// entry_id (whose key is its entry id).
func (c *Consumer) entryDone(ctx context.Context, q rowQuerier, id string) (bool, error) {
	var done bool
	err := q.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM queue_applied WHERE stream = $1 AND (entry_id = $2 OR msg_id = $2))
	OR EXISTS (SELECT 1 FROM queue_dead WHERE stream = $1 AND (entry_id = $2 OR msg_id = $2))`, c.Stream, id).Scan(&done)
	return done, err
}

// unreadScript tells whether entries of the stream KEYS[1] were deleted
// before group ARGV[1] read them. Entries deleted while pending are
// claimScript's; these were never delivered, so no XAUTOCLAIM tells of
// them, nor which ids they were. Redis 7.0 gives two signs, from XINFO
// STREAM and the group's XINFO GROUPS entry:
//   - an XDEL: max-deleted-entry-id after the group's last-delivered-id;
//   - a trim (XADD MAXLEN or MINID, XTRIM), which deletes a prefix of the
//     stream: the first entry left comes after the group's last delivered,
//     and more entries were added before it (entries-added less the
//     length) than the group has read (entries-read, its logical count,
//     known for a group created with ENTRIESREAD: createGroupScript). Counted only while no entry was
//     ever XDELed (max-deleted-entry-id 0-0), whose tombstones the length
//     leaves out, and when Redis knows entries-read.
//
// The string KEYS[2] keeps the id up to which deletions were told, so that
// each is told once: the script returns {after, up to, how many (-1:
// unknown)} for the new ones, and moves KEYS[2]; or false. The consumer's
// own trim never deletes past a group's last delivered entry (see
// trimScript).
var unreadScript = redis.NewScript(lessLua + `
local s = {}
local r = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #r, 2 do s[r[i]] = r[i + 1] end
local g
for _, x in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local f = {}
  for i = 1, #x, 2 do f[x[i]] = x[i + 1] end
  if f['name'] == ARGV[1] then g = f end
end
if not g or not s['max-deleted-entry-id'] then
  return false
end
local from = g['last-delivered-id']
local told = redis.call('GET', KEYS[2])
if told and less(from, told) then from = told end
local deleted = s['max-deleted-entry-id']
if less(from, deleted) then
  redis.call('SET', KEYS[2], deleted)
  return {from, deleted, -1}
end
local read = g['entries-read']
if deleted ~= '0-0' or not read then
  return false
end
local lost = s['entries-added'] - s['length'] - read
local upto = s['last-generated-id']
if s['length'] > 0 then upto = s['recorded-first-entry-id'] end
if lost <= 0 or not less(from, upto) then
  return false
end
redis.call('SET', KEYS[2], upto)
return {from, upto, lost}
`)

// createGroupScript creates group ARGV[1] of the stream KEYS[1] (and the
// stream) at its start, with ENTRIESREAD 0: Redis then counts the
// entries the group reads, which unreadScript compares with the entries
// added. A group created without it (by hand, or with XGROUP CREATE's
// default) has that count unknown until it reads past the stream's first
// entry, as has one moved with XGROUP SETID: a count taken for 0 there
// told an operator's replay (SETID to 0, after the consumer's own trims)
// as lost messages (TestReplayFromStartNotTakenForUnread). An existing
// group is left as it is: the reply is XGROUP's BUSYGROUP error.
var createGroupScript = redis.NewScript(`
return redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM', 'ENTRIESREAD', '0')
`)

// unreadKey is the id up to which deletions of unread entries were told
// (see unreadScript): in the stream's hash slot.
func (c *Consumer) unreadKey() string { return "{" + c.Stream + "}:unread:" + c.Group }

// noticeUnread logs, at ERROR (LogUnread), entries deleted from the stream
// by others before the group read them (see unreadScript): those were
// lost without a trace (TestTrimmedUnreadEntriesNoticed: 4 of 6 messages
// trimmed by a producer's XADD MAXLEN, nothing logged). It runs before
// each XREADGROUP: once the group reads past them the deletion can no
// longer be told, so one between it and the read goes unnoticed. A
// refused script is logged once (LogUnreadUnchecked) and not tried again:
// the claim, a script of its own, may still run (it was logged as
// LogUnrecorded, which says that it does not: TestConsumerWithoutXInfo);
// another error ends the term.
func (c *Consumer) noticeUnread(ctx context.Context) error {
	if c.noUnread.Load() {
		return nil
	}
	v, err := bound.Call(ctx, func() (any, error) {
		return unreadScript.Run(ctx, c.Redis, []string{c.Stream, c.unreadKey()}, c.Group).Result()
	}, nil)
	switch {
	case errors.Is(err, redis.Nil):
		return nil
	case refused(err):
		if !c.noUnread.Swap(true) {
			c.log().Error(LogUnreadUnchecked, "consumer", c.Name, "err", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("queue: look for entries trimmed unread: %w", err)
	}
	r, ok := v.([]any)
	if !ok || len(r) != 3 {
		return fmt.Errorf("queue: unread script replied %v", v)
	}
	n, _ := r[2].(int64)
	how := "some"
	if n > 0 {
		how = strconv.FormatInt(n, 10)
	}
	c.log().Error(LogUnread, "consumer", c.Name, "after", r[0], "up_to", r[1], "n", n,
		"err", fmt.Errorf("queue: %s entries of stream %q after %v, up to %v, were trimmed before group %q read them: their messages are lost", how, c.Stream, r[0], r[1], c.Group))
	return nil
}
