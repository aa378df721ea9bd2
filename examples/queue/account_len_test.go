package queue_test

import (
	"crypto/rand"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
)

// randomAccount returns n bytes of random letters and digits: text
// PostgreSQL cannot compress much, as most real identifiers are.
func randomAccount(t *testing.T, n int) string {
	t.Helper()
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// TestProduceRefusesAccountTooLongToApply: the account is queue_balance's
// primary key, and a btree entry holds at most 2704 bytes: a longer
// account (that PostgreSQL cannot compress below that) fails the
// message's transaction every time ("index row size 3016 exceeds btree
// version 4 maximum 2704 for index "queue_balance_pkey""). Produce
// appended a 3,000-byte account and returned no error; the consumer failed
// it on each try, every failure ending the term and holding back the
// messages behind it, and gave it up (queue_dead) on its MaxDeliveries-th
// try: its effect lost to the caller, as for the accounts
// ErrInvalidAccount refuses. Produce must refuse it, and append nothing;
// an account of queue.MaxAccountLen bytes is applied.
func TestProduceRefusesAccountTooLongToApply(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	long := randomAccount(t, 3000)
	if _, err := queue.ProduceID(ctx, rdb, "s", "long", long, 1); !errors.Is(err, queue.ErrInvalidAccount) {
		t.Errorf("ProduceID, a %d-byte account: %v, want ErrInvalidAccount", len(long), err)
	}
	if _, err := queue.Produce(ctx, rdb, "s", long, 1); !errors.Is(err, queue.ErrInvalidAccount) {
		t.Errorf("Produce, a %d-byte account: %v, want ErrInvalidAccount", len(long), err)
	}
	if n, err := rdb.XLen(ctx, "s").Result(); err != nil || n != 0 {
		t.Fatalf("%d entries appended (%v) for the refused accounts", n, err)
	}
	longest := randomAccount(t, queue.MaxAccountLen)
	if _, err := queue.ProduceID(ctx, rdb, "s", "longest", longest, 7); err != nil {
		t.Fatalf("ProduceID, a %d-byte account: %v", len(longest), err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, MaxDeliveries: 2, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	until(t, 10*time.Second, "the longest account's message handled", func() (bool, error) {
		return logs.get(queue.LogApplied)+logs.get(queue.LogDead) > 0, nil
	})
	if n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = $1`, longest); err != nil || n != 7 {
		t.Fatalf("balance of the %d-byte account %d (%v), want 7 (%d dead): MaxAccountLen too long to apply", len(longest), n, err, logs.get(queue.LogDead))
	}
}
