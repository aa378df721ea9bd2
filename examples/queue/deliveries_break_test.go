package queue_test

import (
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
)

// TestMessageBehindPoisonNotDeadOnFirstFailure: MaxDeliveries is "how many
// deliveries of a message may fail before it is given up on", but the
// consumer counted deliveries (XPENDING's delivery count), and a message
// is delivered again, without being tried, each time a term claims the
// batch it is in and an earlier message of the batch fails. Here a message
// A sits behind a poison message P in one batch; P fails on its deliveries
// 1, 2 and 3 and is given up on, as it should be; A, never tried until
// then, is tried on its delivery 3, and its first failure (a row of its
// account locked by another transaction for longer than TxTimeout, the
// kind of failure the next term gets past) gave it up too: queue_dead,
// acknowledged, its effect never applied (balance 0, want 7). A time-out
// is no longer counted at all (TestLockedTableDoesNotKillMessages): A's
// failure here is a CHECK constraint that refuses its account until the
// test drops it, a failure of the message's own that the next term gets
// past.
func TestMessageBehindPoisonNotDeadOnFirstFailure(t *testing.T) {
	ctx, rdb, db := servers(t, 60*time.Second)
	// A's account is refused until A's first try has failed.
	if _, err := db.ExecContext(ctx, `ALTER TABLE queue_balance ADD CONSTRAINT not_yet CHECK (account <> 'held')`); err != nil {
		t.Fatal(err)
	}

	if _, err := queue.Produce(ctx, rdb, "s", "big", math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	poison, err := queue.Produce(ctx, rdb, "s", "big", 1) // overflows, every time
	if err != nil {
		t.Fatal(err)
	}
	a, err := queue.Produce(ctx, rdb, "s", "held", 7)
	if err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Minute, Block: 50 * time.Millisecond, MaxDeliveries: 3,
		Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))

	// P: failed twice, then given up on; A: its first try, over (failed,
	// or given up on).
	until(t, 20*time.Second, "the poison given up on and A's first try over", func() (bool, error) {
		return logs.get(queue.LogDead) >= 1 && logs.get(queue.LogFailed)+logs.get(queue.LogDead) >= 4, nil
	})
	if _, err := db.ExecContext(ctx, `ALTER TABLE queue_balance DROP CONSTRAINT not_yet`); err != nil {
		t.Fatal(err)
	}
	if n, err := count(ctx, db, `SELECT count(*) FROM queue_dead WHERE entry_id = $1`, poison); err != nil || n != 1 {
		t.Fatalf("poison in queue_dead %d times (%v), want 1", n, err)
	}
	until(t, 10*time.Second, "nothing pending", func() (bool, error) {
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	var deliveries int64
	if err := db.QueryRowContext(ctx, `SELECT coalesce(max(deliveries), 0) FROM queue_dead WHERE entry_id = $1`, a).Scan(&deliveries); err != nil {
		t.Fatal(err)
	}
	if deliveries != 0 {
		t.Fatalf("message %s given up on after its first failed try (its delivery %d): queue_dead, its effect never applied", a, deliveries)
	}
	if n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'held'`); err != nil || n != 7 {
		t.Fatalf("balance %d (%v), want 7", n, err)
	}
}
