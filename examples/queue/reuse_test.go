package queue_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/redis/go-redis/v9"
)

// TestNewMessageWithReusedIDIsApplied: the consumer's idempotency is the
// stream entry's id, unique only within one life of the stream. A stream
// that Redis lost (restarted without persistence, which the consumer
// handles by creating the group again) starts over, and a new message can
// get an id an old one had: a producer that sets ids itself, or Redis's
// clock stepped back. The new message is then taken for a redelivery of the
// old one and acknowledged without its effect: lost, with nothing logged
// but "duplicate".
//
// A design question, not a bug with a local fix: the id that makes a
// redelivery a no-op must be the message's own, given by its producer (a
// field of the entry, unique for good), and queue_applied keyed on it; a
// stream id cannot be told from a reused one. Skipped until the example
// chooses (without the Skip it fails: balance 5, want 12).
func TestNewMessageWithReusedIDIsApplied(t *testing.T) {
	t.Skip("design question: the consumer's idempotency key is the stream id, which a stream lost and started over can reuse; a new message with an old id is dropped as a duplicate. The fix is a producer-given message id stored in the entry and keying queue_applied")
	ctx, rdb, db := servers(t, 30*time.Second)
	add := func(amount int64) {
		t.Helper()
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", ID: "1-1", Values: []any{"account", "a", "amount", amount}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	add(5)
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	until(t, 10*time.Second, "the first message applied", func() (bool, error) {
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied`)
		return n == 1, err
	})
	// Redis loses the stream; it starts over, and a new message gets 1-1.
	if err := rdb.Del(ctx, "s").Err(); err != nil {
		t.Fatal(err)
	}
	add(7)
	until(t, 10*time.Second, "the new message handled", func() (bool, error) {
		if logs.get(queue.LogDuplicate) > 0 {
			return true, nil
		}
		n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'a'`)
		return n == 12, err
	})
	if n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'a'`); err != nil || n != 12 {
		t.Fatalf("balance %d (%v), want 12: the new message 1-1 (7) was taken for the old one (5) and dropped", n, err)
	}
}
