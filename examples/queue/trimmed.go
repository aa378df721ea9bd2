package queue

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
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
