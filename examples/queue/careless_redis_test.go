package queue_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/silent"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// A stream's Redis that accepts and never answers, reached through a
// client with go-redis's defaults (reads that ignore the context's
// deadline), the lock being on another Redis that answers: Run returns
// within its caller's deadline. Before, each command waited for go-redis's
// own timeouts and retries: Run returned 5 s after a 1 s deadline.
func TestStreamRedisSilentRunReturnsInTime(t *testing.T) {
	locker, err := redislock.New(redistest.Start(t).Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: silent.Addr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	c := &queue.Consumer{Redis: rdb, DB: pg.NewDB(t), Stream: "s", Group: "g", Name: "c1"}
	const limit = time.Second
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	start := time.Now()
	err = c.Run(ctx, locker)
	if took := time.Since(start); took > limit+time.Second {
		t.Fatalf("Run returned %v after %v, its caller's deadline %v", err, took, limit)
	}
}

// A stream key that holds another type (a careless SET on the name) fails
// every term: the consumer logs why (LogTermEnded, with Redis's WRONGTYPE
// error) and leaves the key as it was. Before, it logged one election
// after another and nothing else, and Run, ended by its context, said
// only "context deadline exceeded".
func TestStreamKeyOfAnotherTypeLogged(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	if err := rdb.Set(ctx, "s", "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	logs := &records{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1", Log: slog.New(logs)}
	running(t, ctx, c)
	until(t, 10*time.Second, "a record of the failed term with WRONGTYPE", func() (bool, error) {
		return logs.has(queue.LogTermEnded, "WRONGTYPE"), nil
	})
	if v, err := rdb.Get(ctx, "s").Result(); err != nil || v != "not a stream" {
		t.Fatalf("the key now holds %q (%v)", v, err)
	}
}

// records is a slog.Handler that keeps each record's message and err.
type records struct {
	mu   sync.Mutex
	seen []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	line := rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			line += ": " + a.Value.String()
		}
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, line)
	return nil
}

// String is the records so far, for a test's failure.
func (r *records) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.seen)
}

func (r *records) has(msg, errPart string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.seen {
		if strings.HasPrefix(l, msg+": ") && strings.Contains(l, errPart) {
			return true
		}
	}
	return false
}

// count is how many records say msg.
func (r *records) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, l := range r.seen {
		if l == msg || strings.HasPrefix(l, msg+": ") {
			n++
		}
	}
	return n
}
