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

// TestLostCommitReplyKeepsLease: a message's transaction commits but its
// caller sees an error (the connection cut after COMMIT reached the
// server, or the context ending while the commit was under way: guard.Tx
// says the outcome is then unknown). The consumer then tries to give the
// message up, in a transaction fenced with the same token on the same
// resource, which guard refuses as a token it already accepted; the
// consumer took that for a newer leader's and ended its term ("term ended:
// fence: lease lost: queue: a newer leader had ...: guard: stale token T
// for queue:s:order-1: token T already accepted"), giving its lease up: 2
// elections, for one leader and nobody else. It must find the message
// applied and go on in its term, logging a duplicate, not a dead letter.
//
// The lost reply is made by the Tx seam: guard.Tx runs and commits, and
// its first success is reported as the error a cut connection gives.
func TestLostCommitReplyKeepsLease(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	entry, err := queue.ProduceID(ctx, rdb, "s", "order-1", "a", 5)
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Bool
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs),
		Tx: func(ctx context.Context, db *sql.DB, resource string, token fence.Token, fn func(*sql.Tx) error) error {
			err := guard.Tx(ctx, db, resource, token, fn)
			if err == nil && lost.CompareAndSwap(false, true) {
				return errors.New("guard: commit: unexpected EOF")
			}
			return err
		}}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	until(t, 10*time.Second, "the message settled", func() (bool, error) {
		state = fmt.Sprintf("%d elected, %d applied, %d duplicate, %d dead, %d failed, %d rejected", logs.get(queue.LogElected), logs.get(queue.LogApplied),
			logs.get(queue.LogDuplicate), logs.get(queue.LogDead), logs.get(queue.LogFailed), logs.get(queue.LogRejected))
		if !lost.Load() {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	if n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'a'`); err != nil || n != 5 {
		t.Fatalf("balance %d (%v), want 5 (%s)", n, err, state)
	}
	if n, err := count(ctx, db, `SELECT count(*) FROM queue_dead`); err != nil || n != 0 {
		t.Fatalf("%d dead letters (%v), want none", n, err)
	}
	if logs.get(queue.LogElected) != 1 || logs.get(queue.LogRejected) != 0 || logs.get(queue.LogDead) != 0 || logs.get(queue.LogDuplicate) != 1 {
		t.Fatalf("entry %s, applied: %s; want 1 election, no rejection, no dead and 1 duplicate logged", entry, state)
	}
}
