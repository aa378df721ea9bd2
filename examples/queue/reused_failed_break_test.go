package queue_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// failTx returns a Consumer.Tx that fails the nth transaction (from 1) on
// resource (a lock wait cut by TxTimeout, say, behind a deposed leader
// paused inside its transaction on that message), and runs the others.
func failTx(resource string, nth int64) func(ctx context.Context, db *sql.DB, r string, token fence.Token, fn func(*sql.Tx) error) error {
	var calls atomic.Int64
	return func(ctx context.Context, db *sql.DB, r string, token fence.Token, fn func(*sql.Tx) error) error {
		if r == resource && calls.Add(1) == nth {
			return errors.New("the database failed")
		}
		return guard.Tx(ctx, db, r, token, fn)
	}
}

// TestReusedIDAfterFailedTryDeadLettered: a message reusing an applied
// id with another account and amount, in a later term, whose first
// transaction fails (the database, or a lock wait cut by TxTimeout). The
// failure is counted in a fenced transaction (giveUp) that looked the id
// up in queue_applied without comparing the content, found it, and took
// the message for a redelivery: before, it was acknowledged as a
// duplicate, with no dead letter (balance of b 0, 1 duplicate, 0 dead).
// It must be given up on as a reused id, as without the failure.
func TestReusedIDAfterFailedTryDeadLettered(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	if _, err := queue.ProduceID(ctx, rdb, "s", "payment:1:approve", "a", 5); err != nil {
		t.Fatal(err)
	}
	locker, err := redislock.New(rdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	first := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	firstCtx, stopFirst := context.WithCancel(ctx)
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Run(firstCtx, locker) }()
	// Applied and acknowledged: LogApplied comes before the XACK, which
	// the stop could cut, and the entry then came back to the next
	// consumer as a duplicate ("1 duplicate, 1 dead", in a full run).
	until(t, 10*time.Second, "the first message applied and acknowledged", func() (bool, error) {
		if logs.get(queue.LogApplied) != 1 {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	stopFirst()
	<-firstDone // its lease released: the next consumer's term has a new token
	reused, err := queue.ProduceID(ctx, rdb, "s", "payment:1:approve", "b", 7)
	if err != nil {
		t.Fatal(err)
	}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c2",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs),
		Tx: failTx(queue.Resource("s", "payment:1:approve"), 1)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	seen := func() string {
		return fmt.Sprintf("%d elected, %d applied, %d duplicate, %d dead, %d failed", logs.get(queue.LogElected),
			logs.get(queue.LogApplied), logs.get(queue.LogDuplicate), logs.get(queue.LogDead), logs.get(queue.LogFailed))
	}
	state := seen()
	until(t, 10*time.Second, "the reused message settled", func() (bool, error) {
		state = seen()
		if logs.get(queue.LogDuplicate)+logs.get(queue.LogDead) == 0 {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	if logs.get(queue.LogDead) != 1 || logs.get(queue.LogDuplicate) != 0 {
		t.Fatalf("%s; want 1 dead, 0 duplicate", seen())
	}
	deadLetters(t, ctx, db, map[string]string{"b 7": reused})
	if n, err := count(ctx, db, `SELECT coalesce(sum(balance), 0) FROM queue_balance WHERE account = 'b'`); err != nil || n != 0 {
		t.Fatalf("balance of b %d (%v), want 0", n, err)
	}
}

// TestReusedIDAfterFailedTryInOneTermKeepsLease: as above, but both
// messages come in one term, so that the failure's count is fenced with
// the token that applied the id: guard refuses it as already accepted, and
// the consumer, finding the id applied with other content, did not know
// that refusal for its own. Before, it took it for a newer leader's and
// ended its term ("a newer leader had"; 2 elected, 1 terms ended), the
// next term giving the message up on. The leader must give it up on in
// its term.
func TestReusedIDAfterFailedTryInOneTermKeepsLease(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	if _, err := queue.ProduceID(ctx, rdb, "s", "payment:1:approve", "a", 5); err != nil {
		t.Fatal(err)
	}
	reused, err := queue.ProduceID(ctx, rdb, "s", "payment:1:approve", "b", 7)
	if err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs),
		Tx: failTx(queue.Resource("s", "payment:1:approve"), 2)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	seen := func() string {
		return fmt.Sprintf("%d elected, %d applied, %d duplicate, %d dead, %d terms ended", logs.get(queue.LogElected),
			logs.get(queue.LogApplied), logs.get(queue.LogDuplicate), logs.get(queue.LogDead), logs.get(queue.LogTermEnded))
	}
	state := seen()
	until(t, 10*time.Second, "both messages settled", func() (bool, error) {
		state = seen()
		if logs.get(queue.LogApplied)+logs.get(queue.LogDuplicate)+logs.get(queue.LogDead) < 2 {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	if logs.get(queue.LogElected) != 1 || logs.get(queue.LogTermEnded) != 0 || logs.get(queue.LogDead) != 1 {
		t.Fatalf("%s; want 1 elected, 0 terms ended, 1 dead", seen())
	}
	deadLetters(t, ctx, db, map[string]string{"b 7": reused})
}

// TestReusedIDOfDeadMessageNotDropped: an id given up on (queue_dead:
// here a message whose amount overflows the balance, MaxDeliveries 1) is
// reused by a message with another account and amount. The consumer
// compares content only with queue_applied's row; queue_dead keeps the
// fields as one quoted string, and a message found there is taken for a
// redelivery: the new message is acknowledged as a duplicate, neither
// applied nor recorded (balance of b 0, 1 duplicate, 1 dead: the
// overflow's), INFO its only trace. Decided: the id is done, as one
// applied is, and the message is given up on as a reused id, with a dead
// letter of its own (its fields differ from the dead one's); a retry of
// the dead message itself (same fields) is still a duplicate.
func TestReusedIDOfDeadMessageNotDropped(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	if _, err := queue.Produce(ctx, rdb, "s", "big", math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.ProduceID(ctx, rdb, "s", "payment:1:approve", "big", 1); err != nil { // overflows
		t.Fatal(err)
	}
	reused, err := queue.ProduceID(ctx, rdb, "s", "payment:1:approve", "b", 7)
	if err != nil {
		t.Fatal(err)
	}
	// The producer's retry of the dead message: the same fields.
	if _, err := queue.ProduceID(ctx, rdb, "s", "payment:1:approve", "big", 1); err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1", MaxDeliveries: 1,
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	seen := func() string {
		return fmt.Sprintf("%d applied, %d duplicate, %d dead", logs.get(queue.LogApplied), logs.get(queue.LogDuplicate), logs.get(queue.LogDead))
	}
	state := seen()
	until(t, 10*time.Second, "the four messages settled", func() (bool, error) {
		state = seen()
		if logs.get(queue.LogApplied)+logs.get(queue.LogDuplicate)+logs.get(queue.LogDead) < 4 {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	applied, err := count(ctx, db, `SELECT coalesce(sum(balance), 0) FROM queue_balance WHERE account = 'b'`)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := count(ctx, db, `SELECT count(*) FROM queue_dead WHERE entry_id = $1`, reused)
	if err != nil {
		t.Fatal(err)
	}
	if applied != 0 || dead != 1 || logs.get(queue.LogDead) != 2 || logs.get(queue.LogDuplicate) != 1 {
		t.Fatalf("balance of b %d, %d dead letters of entry %s (%s); want it given up on as a reused id (0, 1, 2 dead), the retry a duplicate", applied, dead, reused, seen())
	}
}

// TestMalformedReusesOfDeadIDEachRecorded: three malformed entries under
// one message id, each with other fields. The first is dead under the id;
// the second reuses it, and is given up on under reusedKey, which hashes
// the account and amount, "" and 0 for every malformed message; so the
// third found that dead letter and was logged a duplicate and
// acknowledged, its fields recorded nowhere ("2 dead letters, 2 dead, 1
// duplicate"), though a reuse is to get its own.
func TestMalformedReusesOfDeadIDEachRecorded(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	for _, fields := range [][]any{
		{queue.IDField, "payment:9", "account", "a", "amount", "abc"},
		{queue.IDField, "payment:9", "account", "b", "amount", "xyz"},
		{queue.IDField, "payment:9", "account", "c", "amount", "1.5"},
	} {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: fields}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	seen := func() string {
		return fmt.Sprintf("%d dead, %d duplicate", logs.get(queue.LogDead), logs.get(queue.LogDuplicate))
	}
	state := seen()
	until(t, 10*time.Second, "the three entries settled", func() (bool, error) {
		state = seen()
		if logs.get(queue.LogDead)+logs.get(queue.LogDuplicate) < 3 {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	dead, err := count(ctx, db, `SELECT count(*) FROM queue_dead WHERE stream = 's' AND msg_id LIKE 'payment:9%'`)
	if err != nil {
		t.Fatal(err)
	}
	if dead != 3 || logs.get(queue.LogDead) != 3 {
		t.Fatalf("%d dead letters, %s; want each malformed entry its own (3, 3 dead, 0 duplicate)", dead, seen())
	}
}
