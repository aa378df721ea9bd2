package queue_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/redis/go-redis/v9"
)

// TestNewMessageWithReusedIDIsApplied: the consumer's idempotency was the
// stream entry's id, unique only within one life of the stream. A stream
// that Redis lost (restarted without persistence, which the consumer
// handles by creating the group again; a failover to a replica whose
// machine's clock is behind, XADD's ids following the server's clock)
// starts over, and a new message can get an id an old one had. The new
// message was then taken for a redelivery of the old one and acknowledged
// without its effect: lost, with nothing logged but "duplicate" (balance 5,
// want 12).
//
// The entries here are what Produce writes (the message id in the field
// queue.IDField), with the stream ids a clock stepped back gives: XADD
// cannot be made to reuse an id with '*', so the test names it.
func TestNewMessageWithReusedIDIsApplied(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	add := func(msgID string, amount int64) {
		t.Helper()
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", ID: "1-1",
			Values: []any{queue.IDField, msgID, "account", "a", "amount", amount}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	add("5f0c2b7e9a1d4c3e8b6a0f1e2d3c4b5a", 5)
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
	add("c41e9d0a7b2f4e6c9d8a1b3c5e7f9a0b", 7)
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

// TestNewMessageWithReusedIDOfDeadOneIsApplied: as above, but the old
// message with the reused stream id was given up on (queue_dead), not
// applied: the new one must not be taken for it either.
func TestNewMessageWithReusedIDOfDeadOneIsApplied(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	add := func(msgID, amount string) {
		t.Helper()
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", ID: "1-1",
			Values: []any{queue.IDField, msgID, "account", "a", "amount", amount}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	add("5f0c2b7e9a1d4c3e8b6a0f1e2d3c4b5a", "ten") // malformed: dead at once
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	until(t, 10*time.Second, "the first message given up on", func() (bool, error) {
		n, err := count(ctx, db, `SELECT count(*) FROM queue_dead`)
		return n == 1, err
	})
	if err := rdb.Del(ctx, "s").Err(); err != nil {
		t.Fatal(err)
	}
	add("c41e9d0a7b2f4e6c9d8a1b3c5e7f9a0b", "7")
	until(t, 10*time.Second, "the new message handled", func() (bool, error) {
		if logs.get(queue.LogDuplicate) > 0 {
			return true, nil
		}
		n, err := count(ctx, db, `SELECT sum(balance) FROM queue_balance WHERE account = 'a'`)
		return n == 7, err
	})
	if n, err := count(ctx, db, `SELECT sum(balance) FROM queue_balance WHERE account = 'a'`); err != nil || n != 7 {
		t.Fatalf("balance %d (%v), want 7: the new message 1-1 was taken for the dead one and dropped", n, err)
	}
}
