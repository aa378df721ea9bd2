package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/memlock"
)

// TestResourcesOfTwoStreamsDistinct: the guard resource of a message is
// Resource(stream, key). Before message ids a key was a stream entry id,
// which holds no ':', so two streams' resources never met; a message id
// may hold ':' (the docs' own "payment:1001:approve"), and a stream's
// name could too ("orders", "orders:eu"). Then the message "eu:42" of
// "orders" and the message "42" of "orders:eu" fenced on one resource with
// the tokens of two unrelated locks (LockName of each stream): the leader
// with the older token was refused as stale (guard.ErrStale), took itself
// for deposed and gave its lease up, though nobody replaced it.
//
// Resource keeps its format (a new one would leave old and new consumers
// fencing on different resources during an upgrade), and message ids keep
// their ':' (entries already produced with one would be given up on as
// malformed): a stream whose name holds ':' is refused, with
// fence.ErrInvalidName, by Produce, ProduceID and Consumer.Run, before
// anything is sent. With no ':' in any stream, queue:<stream>: ends at
// the first ':' after the prefix, and no two streams' resources (nor
// LockNames) meet.
func TestResourcesOfTwoStreamsDistinct(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	locker, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ s1, k1, s2, k2 string }{
		{"orders", "eu:42", "orders:eu", "42"},
		{"orders", "payment:1001:approve", "orders:payment", "1001:approve"},
	} {
		if queue.Resource(c.s1, c.k1) != queue.Resource(c.s2, c.k2) {
			continue
		}
		// One of the two must be refused, and it is the stream with ':'.
		if _, err := queue.ProduceID(ctx, rdb, c.s1, c.k1, "a", 1); err != nil {
			t.Fatalf("message %q of stream %q: %v", c.k1, c.s1, err)
		}
		if _, err := queue.ProduceID(ctx, rdb, c.s2, c.k2, "a", 1); !errors.Is(err, fence.ErrInvalidName) {
			t.Errorf("ProduceID to stream %q: %v, want fence.ErrInvalidName (its message %q fences on %q, as message %q of %q does)",
				c.s2, err, c.k2, queue.Resource(c.s2, c.k2), c.k1, c.s1)
		}
		if _, err := queue.Produce(ctx, rdb, c.s2, "a", 1); !errors.Is(err, fence.ErrInvalidName) {
			t.Errorf("Produce to stream %q: %v, want fence.ErrInvalidName", c.s2, err)
		}
		if n, err := rdb.Exists(ctx, c.s2).Result(); err != nil || n != 0 {
			t.Errorf("stream %q exists after its refusals (%v)", c.s2, err)
		}
		cons := &queue.Consumer{Redis: rdb, DB: pg.NewDB(t), Stream: c.s2, Group: "g", Name: "n"}
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		err := cons.Run(rctx, locker)
		rcancel()
		if !errors.Is(err, fence.ErrInvalidName) {
			t.Errorf("Consumer of stream %q: %v, want fence.ErrInvalidName", c.s2, err)
		}
	}
}
