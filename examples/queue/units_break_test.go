package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/memlock"
	"github.com/redis/go-redis/v9"
)

// TestRunDurationWithoutUnitRefused: a Consumer's Block, MinIdle or
// TxTimeout under a millisecond is most likely a duration written without
// its unit (Block: 50 for 50 ms is 50 ns), as fence.Backoff refuses for
// its bounds. Block went out as XREADGROUP's BLOCK 0, which waits for a new
// entry for good: the leader claimed no idle entry while none came, and its
// read ended after go-redis's 10 s read timeout, ending the term ("term
// ended: queue: XREADGROUP: ... i/o timeout") every 10 s; an entry another
// process read (TestEntriesReadByOthersAreClaimed, MinIdle 300 ms) was
// applied after 10.1 s, not within MinIdle. A TxTimeout of 10 (meant
// seconds) failed every transaction and every dead letter: the queue stood
// still. Such a Consumer now fails at once with ErrInvalidOption; a
// millisecond is accepted.
func TestRunDurationWithoutUnitRefused(t *testing.T) {
	locker, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing listens on port 1: a Consumer that got as far as Redis
	// would fail there, not with ErrInvalidOption.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	db := pg.NewDB(t)
	ok := func() queue.Consumer {
		return queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "n"}
	}
	for _, tc := range []struct {
		name   string
		refuse bool
		edit   func(*queue.Consumer)
	}{
		{"Block 50", true, func(c *queue.Consumer) { c.Block = 50 }},
		{"Block 999µs", true, func(c *queue.Consumer) { c.Block = time.Millisecond - 1 }},
		{"MinIdle 300", true, func(c *queue.Consumer) { c.MinIdle = 300 }},
		{"TxTimeout 10", true, func(c *queue.Consumer) { c.TxTimeout = 10 }},
		{"Block 1ms", false, func(c *queue.Consumer) { c.Block = time.Millisecond }},
		{"MinIdle 1ms", false, func(c *queue.Consumer) { c.MinIdle = time.Millisecond }},
		{"TxTimeout 1ms", false, func(c *queue.Consumer) { c.TxTimeout = time.Millisecond }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok()
			tc.edit(&c)
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			start := time.Now()
			err := c.Run(ctx, locker)
			switch {
			case tc.refuse && !errors.Is(err, fence.ErrInvalidOption):
				t.Fatalf("Run returned after %v with %v, want ErrInvalidOption at once", time.Since(start).Round(time.Millisecond), err)
			case !tc.refuse && !errors.Is(err, context.DeadlineExceeded):
				t.Fatalf("%v, want it accepted (Run ending with ctx)", err)
			}
		})
	}
}
