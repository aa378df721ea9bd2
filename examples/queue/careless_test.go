package queue_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/refused"
	"github.com/fencekit/fence/internal/silent"
	"github.com/fencekit/fence/memlock"
	_ "github.com/jackc/pgx/v5/stdlib"
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

// A PostgreSQL that is down when the consumer starts (refused, or
// accepting and never answering) gives CreateSchema an error within the
// caller's deadline, and Run, with messages waiting, returns within its
// caller's deadline too, having applied and acknowledged nothing.
func TestPostgresDownAtStart(t *testing.T) {
	for name, addr := range map[string]string{"refused": refused.Addr(t), "silent": silent.Addr(t)} {
		t.Run(name, func(t *testing.T) {
			rdb := redistest.Start(t).Client(t)
			db, err := sql.Open("pgx", fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", addr))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			const limit = time.Second
			ctx, cancel := context.WithTimeout(t.Context(), limit)
			start := time.Now()
			err = queue.CreateSchema(ctx, db)
			cancel()
			if err == nil || time.Since(start) > limit+time.Second {
				t.Fatalf("CreateSchema: %v after %v, want an error within %v", err, time.Since(start), limit)
			}

			bg, bgCancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer bgCancel()
			if _, err := queue.ProduceID(bg, rdb, "s", "m1", "a", 1); err != nil {
				t.Fatal(err)
			}
			locker, err := memlock.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1", Block: 50 * time.Millisecond}
			ctx, cancel = context.WithTimeout(t.Context(), limit)
			defer cancel()
			start = time.Now()
			err = c.Run(ctx, locker)
			if took := time.Since(start); took > limit+time.Second {
				t.Errorf("Run returned %v after %v, its caller's deadline %v", err, took, limit)
			}
			if p, err := pending(bg, rdb, "s", "g"); err != nil || p != 1 {
				t.Errorf("pending %d (%v), want the message still pending", p, err)
			}
		})
	}
}

// A stream too long for the guard resource of its messages, which the
// consumer refuses, is refused by Produce too, with fence.ErrInvalidName
// and not ErrInvalidID, and nothing is appended. Before, Produce appended
// to a 210-byte stream (a random id's resource fits) that no Consumer
// would read.
func TestStreamTooLongForConsumerRefusedByProduce(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := strings.Repeat("s", 210)
	c := &queue.Consumer{Redis: rdb, DB: &sql.DB{}, Stream: stream, Group: "g", Name: "n"}
	if err := c.Run(ctx, nil); !errors.Is(err, fence.ErrInvalidName) {
		t.Fatalf("Consumer of a %d-byte stream: %v, want fence.ErrInvalidName", len(stream), err)
	}
	if _, err := queue.Produce(ctx, rdb, stream, "a", 1); !errors.Is(err, fence.ErrInvalidName) || errors.Is(err, queue.ErrInvalidID) {
		t.Errorf("Produce to a %d-byte stream: %v, want fence.ErrInvalidName (and not ErrInvalidID)", len(stream), err)
	}
	if n, err := rdb.Exists(ctx, stream).Result(); err != nil || n != 0 {
		t.Errorf("the stream exists after the refusal (%v)", err)
	}
}
