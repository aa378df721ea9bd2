package queue_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// counter is a slog.Handler that counts records by message.
type counter struct {
	mu    sync.Mutex
	n     map[string]int
	attrs map[string]map[string]string // the last record's attributes, by message
}

func (c *counter) Enabled(context.Context, slog.Level) bool { return true }
func (c *counter) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *counter) WithGroup(string) slog.Handler            { return c }
func (c *counter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[r.Message]++
	if c.attrs == nil {
		c.attrs = map[string]map[string]string{}
	}
	last := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		last[a.Key] = a.Value.String()
		return true
	})
	c.attrs[r.Message] = last
	return nil
}

// attr is attribute key of the last record logged as msg.
func (c *counter) attr(msg, key string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.attrs[msg][key]
}

func (c *counter) get(msg string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[msg]
}

// until polls cond (with a deadline) until it holds. If it does not, the
// failure quotes *state, if given.
func until(t *testing.T, within time.Duration, what string, cond func() (bool, error), state ...*string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			for _, s := range state {
				what += " (" + *s + ")"
			}
			t.Fatalf("no %s within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

// servers starts a Redis server and a PostgreSQL database with the queue's
// schema, for a test that takes at most within.
func servers(t *testing.T, within time.Duration) (context.Context, *redis.Client, *sql.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	t.Cleanup(cancel)
	rdb := redistest.Start(t).Client(t)
	db := pg.NewDB(t)
	if err := queue.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	return ctx, rdb, db
}

// running runs c on a redislock Locker of its Redis until the test ends.
func running(t *testing.T, ctx context.Context, c *queue.Consumer, opts ...fence.LeadOption) {
	t.Helper()
	locker, err := redislock.New(c.Redis.(redis.UniversalClient), nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, locker, opts...) }()
	t.Cleanup(func() { stop(); <-done })
}

func count(ctx context.Context, db *sql.DB, query string, args ...any) (int64, error) {
	var n sql.NullInt64
	err := db.QueryRowContext(ctx, query, args...).Scan(&n)
	return n.Int64, err
}

func pending(ctx context.Context, rdb *redis.Client, stream, group string) (int64, error) {
	p, err := rdb.XPending(ctx, stream, group).Result()
	if err != nil {
		return 0, err
	}
	return p.Count, nil
}

// Redelivered messages (the group's cursor moved back, as after a consumer
// that committed and died before XACK; KeepEntries, so that the entries
// are there to be read again) are no-ops: the unique constraint
// finds them applied, the balance does not move, and they are acknowledged.
func TestRedeliveredMessagesAreNoOps(t *testing.T) {
	const n = 20
	ctx, rdb, db := servers(t, 30*time.Second)
	var want int64
	for i := 1; i <= n; i++ {
		if _, err := queue.Produce(ctx, rdb, "s", fmt.Sprintf("acct-%d", i%3), int64(i)); err != nil {
			t.Fatal(err)
		}
		want += int64(i)
	}
	logs := &counter{}
	c := &queue.Consumer{KeepEntries: true, Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c)

	settled := func(dups int) func() (bool, error) {
		return func() (bool, error) {
			rows, err := count(ctx, db, `SELECT count(*) FROM queue_applied`)
			if err != nil || rows != n || logs.get(queue.LogDuplicate) != dups {
				return false, err
			}
			p, err := pending(ctx, rdb, "s", "g")
			return p == 0, err
		}
	}
	until(t, 10*time.Second, "first delivery applied and acknowledged", settled(0))
	if err := rdb.XGroupSetID(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "redelivery found applied and acknowledged", settled(n))
	sum, err := count(ctx, db, `SELECT sum(balance) FROM queue_balance`)
	if err != nil {
		t.Fatal(err)
	}
	if sum != want || logs.get(queue.LogApplied) != n {
		t.Fatalf("balance %d, %d applied; want %d and %d", sum, logs.get(queue.LogApplied), want, n)
	}
}

// A Consumer without Stream, Group or Name, or whose lock name is not
// valid, fails at once, before anything is sent (Redis is nil here).
func TestRunBadInput(t *testing.T) {
	for _, c := range []*queue.Consumer{
		{Group: "g", Name: "n"},
		{Stream: "s", Name: "n"},
		{Stream: "s", Group: "g"},
	} {
		if err := c.Run(t.Context(), nil); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("%+v: %v, want ErrInvalidOption", c, err)
		}
	}
	c := &queue.Consumer{Stream: "s\x00", Group: "g", Name: "n"}
	if err := c.Run(t.Context(), nil); !errors.Is(err, fence.ErrInvalidName) {
		t.Errorf("lock name with NUL: %v, want ErrInvalidName", err)
	}
}

// An entry that another consumer of the group read while c1 led (a deposed
// leader that paused between checking its lease and reading) is claimed by
// the leader once idle for MinIdle, and applied.
func TestEntriesReadByOthersAreClaimed(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: 300 * time.Millisecond, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c)
	if _, err := queue.Produce(ctx, rdb, "s", "acct-1", 1); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "the first message applied", func() (bool, error) {
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied`)
		return n == 1, err
	})
	// Add an entry and read it as "ghost" in one transaction, so that the
	// leader, blocked in XREADGROUP, cannot take it first.
	var read *redis.XStreamSliceCmd
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{"account", "acct-2", "amount", 2}})
		read = p.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "ghost", Streams: []string{"s", ">"}, Count: 1, Block: -1})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ghost := read.Val()
	if len(ghost) != 1 || len(ghost[0].Messages) != 1 {
		t.Fatalf("ghost read %v", ghost)
	}
	id := ghost[0].Messages[0].ID
	until(t, 10*time.Second, "the ghost's entry applied by the leader", func() (bool, error) {
		var by string
		err := db.QueryRowContext(ctx, `SELECT consumer FROM queue_applied WHERE msg_id = $1`, id).Scan(&by)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return by == "c1", err
	})
	until(t, 5*time.Second, "nothing pending", func() (bool, error) {
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	if logs.get(queue.LogClaimed) == 0 {
		t.Fatal("no claim logged")
	}
}
