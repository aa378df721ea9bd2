package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestProduceResentAppendsOnce: the connection breaks after Redis ran
// Produce's XADD and before its reply arrives; go-redis, as it does by
// default (MaxRetries 3), sends the command again. The stream then held the
// message twice, under two ids, and the consumer, whose idempotency is the
// stream id, applied both: one Produce, the amount added twice. Produce
// must append once.
func TestProduceResentAppendsOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	srv := redistest.Start(t)
	d := redistest.NewDropper("acct-resent")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: d.Dial}) // go-redis's default MaxRetries: 3
	t.Cleanup(func() { _ = rdb.Close() })
	// Warm up: the first Produce may load a script; the armed one runs it.
	if _, err := queue.Produce(ctx, rdb, "s", "acct-warm", 1); err != nil {
		t.Fatal(err)
	}
	d.Arm()
	id, err := queue.Produce(ctx, rdb, "s", "acct-resent", 5)
	if err != nil {
		t.Fatalf("Produce with its first reply lost: %v", err)
	}
	if d.Dropped() != 1 {
		t.Fatalf("%d replies dropped; want 1", d.Dropped())
	}
	entries, err := rdb.XRange(ctx, "s", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		if e.Values["account"] == "acct-resent" {
			ids = append(ids, e.ID)
		}
	}
	if len(ids) != 1 || ids[0] != id {
		t.Fatalf("one Produce (id %s) left entries %v in the stream; want just %s", id, ids, id)
	}
}

// TestProduceWithinDeadlineOnPausedServer: a Redis server that does not
// answer (paused here) must not hold Produce past the caller's deadline.
// With a client that does not apply the context's deadline to its reads
// (go-redis's default, ContextTimeoutEnabled false), ProduceID returned
// "context deadline exceeded" 5 s after a 200 ms deadline.
func TestProduceWithinDeadlineOnPausedServer(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	if _, err := queue.Produce(t.Context(), rdb, "s", "a", 1); err != nil { // loads the script
		t.Fatal(err)
	}
	resume := srv.Pause(t)
	defer resume()
	const deadline = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	start := time.Now()
	_, err := queue.ProduceID(ctx, rdb, "s", "payment:1:approve", "a", 1)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || took > 5*deadline {
		t.Fatalf("ProduceID on a paused server: %v after %v; want the deadline's error within %v", err, took, 5*deadline)
	}
}
