package queue_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/memlock"
)

// A consumer started before any producer (the stream does not exist yet)
// creates the stream and its group, waits, and applies the messages
// produced later.
func TestConsumerStartedBeforeStreamExists(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "later", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c)
	until(t, 10*time.Second, "the group made on the missing stream", func() (bool, error) {
		groups, err := rdb.XInfoGroups(ctx, "later").Result()
		if err != nil && strings.Contains(err.Error(), "no such key") {
			return false, nil
		}
		return len(groups) == 1, err
	})
	if _, err := queue.ProduceID(ctx, rdb, "later", "first", "a", 7); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "the message applied", func() (bool, error) {
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied WHERE stream = 'later' AND msg_id = 'first'`)
		return n == 1 && logs.get(queue.LogFailed) == 0, err
	})
}

// A stream name of odd bytes (empty, NUL, a control character, bytes that
// are not UTF-8, a brace, ':') is refused by Produce and ProduceID with
// fence.ErrInvalidName, not blamed on the id, and nothing is appended; a
// Consumer of it fails at once with ErrInvalidName (or, empty,
// ErrInvalidOption) before anything is sent.
func TestOddStreamNamesRefused(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	locker, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"", "s\x00", "s\nx", "s\x7f", "s\xff", "{s}", "a:b", "s\u0085"} {
		if _, err := queue.Produce(ctx, rdb, s, "a", 1); !errors.Is(err, fence.ErrInvalidName) || errors.Is(err, queue.ErrInvalidID) {
			t.Errorf("Produce to %q: %v, want fence.ErrInvalidName (and not ErrInvalidID)", s, err)
		}
		if _, err := queue.ProduceID(ctx, rdb, s, "m1", "a", 1); !errors.Is(err, fence.ErrInvalidName) || errors.Is(err, queue.ErrInvalidID) {
			t.Errorf("ProduceID to %q: %v, want fence.ErrInvalidName (and not ErrInvalidID)", s, err)
		}
		c := &queue.Consumer{Redis: rdb, DB: &sql.DB{}, Stream: s, Group: "g", Name: "n"}
		want := fence.ErrInvalidName
		if s == "" {
			want = fence.ErrInvalidOption
		}
		if err := c.Run(ctx, locker); !errors.Is(err, want) {
			t.Errorf("Consumer of %q: %v, want %v", s, err, want)
		}
	}
	if keys, err := rdb.Keys(ctx, "*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("keys after the refusals: %q (%v)", keys, err)
	}
}
