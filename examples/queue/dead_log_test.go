package queue_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/guard"
)

// TestAppliedMeanwhileNotLoggedDead: the leader's transaction of a message
// fails (an error of the message's kind, counted), and before it records
// the failure a deposed leader, with a smaller token, commits the same
// message late (it had fenced nothing on it yet, so the fence lets it
// through). The leader's dead-letter transaction then finds the message
// applied and acknowledges it: right. But it logged "dead", at level
// ERROR, with the failure and a delivery count, for a message that was
// applied and has no row in queue_dead (1 dead logged, 0 duplicates): an
// operator alerted on dead letters looks for one that does not exist. It
// must log a duplicate.
//
// The Tx seam makes the interleaving: the leader's first transaction
// commits the message as the deposed leader (token - 1) would, and reports
// a failure of its own.
func TestAppliedMeanwhileNotLoggedDead(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	if _, err := queue.ProduceID(ctx, rdb, "s", "order-1", "a", 5); err != nil {
		t.Fatal(err)
	}
	var first atomic.Bool
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs),
		Tx: func(ctx context.Context, db *sql.DB, resource string, token fence.Token, fn func(*sql.Tx) error) error {
			if first.CompareAndSwap(false, true) {
				if err := guard.Tx(ctx, db, resource, token-1, fn); err != nil {
					return err
				}
				return errors.New("ERROR: the leader's own try failed (SQLSTATE 22003)")
			}
			return guard.Tx(ctx, db, resource, token, fn)
		}}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	seen := func() string {
		return fmt.Sprintf("%d applied, %d duplicate, %d dead, %d failed", logs.get(queue.LogApplied),
			logs.get(queue.LogDuplicate), logs.get(queue.LogDead), logs.get(queue.LogFailed))
	}
	until(t, 10*time.Second, "the message settled", func() (bool, error) {
		state = seen()
		if !first.Load() {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	if n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'a'`); err != nil || n != 5 {
		t.Fatalf("balance %d (%v), want 5 (%s)", n, err, seen())
	}
	if n, err := count(ctx, db, `SELECT count(*) FROM queue_dead`); err != nil || n != 0 {
		t.Fatalf("%d dead letters (%v), want none", n, err)
	}
	if logs.get(queue.LogDead) != 0 || logs.get(queue.LogDuplicate) != 1 {
		t.Fatalf("applied, no dead letter: %s; want no dead and 1 duplicate logged", seen())
	}
}
