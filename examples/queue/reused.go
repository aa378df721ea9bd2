package queue

import (
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/bound"
	"github.com/redis/go-redis/v9"
)

// appliedAs looks m's key up in queue_applied through q. It returns
// errDuplicate if the key was applied with m's account and amount (or m is
// malformed, without them), a *reusedError if with others, sql.ErrNoRows
// if the key was not applied, or the database's error.
func (c *Consumer) appliedAs(ctx context.Context, q rowQuerier, m Message) error {
	r := reusedError{stream: c.Stream, m: m}
	var account string
	var amount int64
	err := q.QueryRowContext(ctx, `SELECT account, amount, entry_id FROM queue_applied WHERE stream = $1 AND msg_id = $2`,
		c.Stream, m.Key).Scan(&account, &amount, &r.entry)
	switch {
	case err != nil:
		return err
	case m.Account == "" || (account == m.Account && amount == m.Amount):
		return errDuplicate
	}
	r.prior = fmt.Sprintf("applied with other content, account %q amount %d", account, amount)
	return &r
}

// deadAs looks m's key up in queue_dead through q, m's entry having
// fields (as quoted for the dead letter). It returns errDuplicate if the
// key was given up on with the same fields (a redelivery, or the
// producer's retry), or as an entry trimmed unread (no fields kept: only
// that entry has its id as key), a *reusedError if with other fields,
// sql.ErrNoRows if the key is not there, or the database's error. A
// message reusing the id of a dead one was taken for a redelivery and
// acknowledged as a duplicate, neither applied nor recorded
// (TestReusedIDOfDeadMessageNotDropped); like one reusing an applied id,
// it is given up on under its own key (giveUpReused), since the id is
// done.
func (c *Consumer) deadAs(ctx context.Context, q rowQuerier, m Message, fields string) error {
	var prior string
	var entry sql.NullString
	err := q.QueryRowContext(ctx, `SELECT fields, entry_id FROM queue_dead WHERE stream = $1 AND msg_id = $2`,
		c.Stream, m.Key).Scan(&prior, &entry)
	switch {
	case err != nil:
		return err
	case prior == fields || prior == "":
		return errDuplicate
	}
	return &reusedError{stream: c.Stream, m: m, entry: entry, prior: "given up on with other fields, " + prior}
}

// reusedError is message m, whose id was applied, or given up on, with
// other content (prior says which; from entry entry; NULL for a row from
// before entry_id).
type reusedError struct {
	stream string
	m      Message
	prior  string
	entry  sql.NullString
}

func (e *reusedError) Error() string {
	entry := e.entry.String
	if !e.entry.Valid {
		entry = e.m.Key // a row from before entry_id: its key is its entry id
	}
	return fmt.Sprintf("queue: message id %q of stream %q was %s (entry %s); "+
		"this entry %s has account %q amount %d: not a redelivery, and not applied under that id",
		e.m.Key, e.stream, e.prior, entry, e.m.ID, e.m.Account, e.m.Amount)
}

// reusedKey is the key under which message m, whose id was applied or
// given up on with other content, is recorded in queue_dead: its own key
// would say that its id was given up on, which the applied message was
// not, and would hold one such message only (a second reuse of the id,
// with a third content, would find it and be dropped). The key is m's,
// then a hash of its content in braces, which no message key holds: a
// retry of that message (same id and content) finds its dead letter,
// another reuse gets its own. The content is the account and amount, or,
// for a malformed m, which has neither, its fields as quoted: every
// malformed reuse of a dead id had one key, and the second was dropped as
// a retry of the first (TestMalformedReusesOfDeadIDEachRecorded).
func reusedKey(m Message) string {
	content := strconv.Quote(m.Account) + " " + strconv.FormatInt(m.Amount, 10)
	if m.Account == "" {
		content = m.fields
	}
	sum := sha256.Sum256([]byte(content))
	return m.Key + "{reused:" + hex.EncodeToString(sum[:16]) + "}"
}

// giveUpReused records entry e, whose message m reuses the id of a message
// applied with another account or amount (r), in queue_dead under
// reusedKey(m), and logs it (dead, or duplicate if it was recorded
// before). The write is not fenced: the applied row stays for good, so m
// can never be applied under its id and there is nothing for a newer
// leader to decide otherwise; any consumer that finds the conflict
// writes the same row. (Fenced on the message's resource, it would also
// be refused whenever the leader's token applied the id earlier in its
// term.) Its error, if any, is why it could not record it; the entry then
// stays pending. ctx is Run's (see apply).
func (c *Consumer) giveUpReused(ctx context.Context, e redis.XMessage, m Message, r *reusedError, token fence.Token) error {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(c.TxTimeout, DefaultTxTimeout))
	defer cancel()
	p, err := bound.Call(ctx, func() ([]redis.XPendingExt, error) {
		return c.Redis.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: c.Stream, Group: c.Group, Start: e.ID, End: e.ID, Count: 1,
		}).Result()
	}, nil)
	if err != nil {
		return fmt.Errorf("queue: XPENDING %s: %w", e.ID, err)
	}
	var deliveries int64 // none known: acknowledged by another consumer meanwhile
	if len(p) > 0 {
		deliveries = p[0].RetryCount
	}
	res, err := c.DB.ExecContext(ctx, `INSERT INTO queue_dead (stream, msg_id, entry_id, fields, deliveries, error, token, consumer)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (stream, msg_id) DO NOTHING`,
		c.Stream, reusedKey(m), e.ID, quoted(e.Values), deliveries, r.Error(), int64(token), c.Name)
	if err != nil {
		return fmt.Errorf("queue: dead letter of %s: %w", e.ID, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		// Recorded before: a redelivery of this entry, or a retry of
		// this message (same id and content).
		c.log().Info(LogDuplicate, "consumer", c.Name, "id", m.ID, "msg_id", m.Key, "token", int64(token))
		return nil
	}
	c.log().Error(LogDead, "consumer", c.Name, "id", m.ID, "msg_id", m.Key, "token", int64(token), "deliveries", deliveries, "err", r)
	return nil
}
