package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/memlock"
	"github.com/redis/go-redis/v9"
)

// A Consumer without Redis or DB, or with a negative duration or count,
// fails at once with ErrInvalidOption, before it campaigns. Before, a nil
// Redis panicked in the first term (a nil DB at the first message), and a
// negative TxTimeout failed every transaction, a negative Block polled
// Redis without pause, a negative MinIdle made every XAUTOCLAIM an error.
//
// So does a Block, MinIdle or TxTimeout under a millisecond, most likely a
// duration written without its unit (Block: 50 for 50 ms is 50 ns), as
// fence.Backoff refuses for its bounds; a millisecond is accepted. Block
// went out as XREADGROUP's BLOCK 0, which waits for a new entry for good:
// the leader claimed no idle entry while none came, and its read ended
// after go-redis's 10 s read timeout, ending the term ("term ended: queue:
// XREADGROUP: ... i/o timeout") every 10 s; an entry another process read
// (TestEntriesReadByOthersAreClaimed, MinIdle 300 ms) was applied after
// 10.1 s, not within MinIdle. A TxTimeout of 10 (meant seconds) failed
// every transaction and every dead letter: the queue stood still.
func TestRunBadConsumer(t *testing.T) {
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
	for name, edit := range map[string]func(*queue.Consumer){
		"nil Redis":              func(c *queue.Consumer) { c.Redis = nil },
		"nil DB":                 func(c *queue.Consumer) { c.DB = nil },
		"negative MinIdle":       func(c *queue.Consumer) { c.MinIdle = -time.Second },
		"negative Block":         func(c *queue.Consumer) { c.Block = -time.Second },
		"negative TxTimeout":     func(c *queue.Consumer) { c.TxTimeout = -time.Second },
		"negative Batch":         func(c *queue.Consumer) { c.Batch = -1 },
		"negative MaxDeliveries": func(c *queue.Consumer) { c.MaxDeliveries = -1 },
		"Block 50":               func(c *queue.Consumer) { c.Block = 50 },
		"Block 999µs":            func(c *queue.Consumer) { c.Block = time.Millisecond - 1 },
		"MinIdle 300":            func(c *queue.Consumer) { c.MinIdle = 300 },
		"TxTimeout 10":           func(c *queue.Consumer) { c.TxTimeout = 10 },
	} {
		t.Run(name, func(t *testing.T) {
			c := ok()
			edit(&c)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			if err := c.Run(ctx, locker); !errors.Is(err, fence.ErrInvalidOption) {
				t.Fatalf("%v, want ErrInvalidOption", err)
			}
		})
	}
	for name, edit := range map[string]func(*queue.Consumer){
		"Block 1ms":     func(c *queue.Consumer) { c.Block = time.Millisecond },
		"MinIdle 1ms":   func(c *queue.Consumer) { c.MinIdle = time.Millisecond },
		"TxTimeout 1ms": func(c *queue.Consumer) { c.TxTimeout = time.Millisecond },
	} {
		t.Run(name, func(t *testing.T) {
			c := ok()
			edit(&c)
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			if err := c.Run(ctx, locker); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%v, want it accepted (Run ending with ctx)", err)
			}
		})
	}
}

// A stream whose lock name is valid but too long for the guard resource of
// its messages (queue:<stream>:<id>, an id up to 41 bytes) fails at once
// with ErrInvalidName. Before, Run led, and every term failed on the first
// message with guard.ErrInvalidResource (giving it up failed the same
// way): the queue stood still for good (seen with a 240-byte stream name,
// a 262-byte resource).
func TestRunStreamTooLongForResource(t *testing.T) {
	locker, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	c := queue.Consumer{Redis: rdb, DB: pg.NewDB(t), Stream: strings.Repeat("s", 240), Group: "g", Name: "n"}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := c.Run(ctx, locker); !errors.Is(err, fence.ErrInvalidName) {
		t.Fatalf("%v, want ErrInvalidName", err)
	}
}

// A Consumer whose Name PostgreSQL's text cannot hold (a NUL, bytes that
// are not UTF-8) fails at once with ErrInvalidOption. Before, Run led (the
// test's 2 s ran out), and every message's transaction writes the name
// (queue_applied.consumer), as does its dead letter (queue_dead.consumer):
// both fail, the first message stays pending, every term ends on it.
func TestRunNameUnstorable(t *testing.T) {
	locker, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	for _, name := range []string{"c\x00", "caf\xe9"} {
		c := queue.Consumer{Redis: rdb, DB: pg.NewDB(t), Stream: "s", Group: "g", Name: name}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		err := c.Run(ctx, locker)
		cancel()
		if !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("Name %q: %v, want ErrInvalidOption", name, err)
		}
	}
}
