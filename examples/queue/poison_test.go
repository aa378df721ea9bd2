package queue_test

import (
	"database/sql"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/redis/go-redis/v9"
)

// A message that can never be applied (its amount overflows the balance:
// SQLSTATE 22003 every time) must not stop the queue: after MaxDeliveries
// failed deliveries it is recorded in queue_dead, in a fenced transaction,
// and acknowledged, and the messages behind it are applied. Before
// queue_dead, every term claimed it first, failed, and ended: the message
// after it was never applied.
func TestPoisonMessageIsDeadLettered(t *testing.T) {
	ctx, rdb, db := servers(t, 60*time.Second)
	if _, err := queue.Produce(ctx, rdb, "s", "big", math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	poison, err := queue.Produce(ctx, rdb, "s", "big", 1) // overflows
	if err != nil {
		t.Fatal(err)
	}
	after, err := queue.Produce(ctx, rdb, "s", "small", 7)
	if err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, MaxDeliveries: 3, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))

	until(t, 20*time.Second, "the message behind the poison applied", func() (bool, error) {
		var n int64
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM queue_applied WHERE entry_id = $1`, after).Scan(&n)
		return n == 1, err
	})
	until(t, 5*time.Second, "nothing pending", func() (bool, error) {
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	var deliveries int64
	var why string
	err = db.QueryRowContext(ctx, `SELECT deliveries, error FROM queue_dead WHERE stream = 's' AND entry_id = $1`, poison).Scan(&deliveries, &why)
	if errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("poison %s not in queue_dead", poison)
	}
	if err != nil {
		t.Fatal(err)
	}
	if deliveries != 3 || why == "" {
		t.Fatalf("dead letter: %d deliveries, error %q; want 3 and the error", deliveries, why)
	}
	if n, err := count(ctx, db, `SELECT count(*) FROM queue_applied WHERE entry_id = $1`, poison); err != nil || n != 0 {
		t.Fatalf("poison applied %d times (%v)", n, err)
	}
	if logs.get(queue.LogFailed) != 2 || logs.get(queue.LogDead) != 1 {
		t.Fatalf("%d failed, %d dead logged; want 2 and 1", logs.get(queue.LogFailed), logs.get(queue.LogDead))
	}
}

// A malformed entry (no account, or an amount that is not an integer) can
// never be applied: it is recorded in queue_dead at once and acknowledged,
// not dropped with nothing but a log line, and the messages behind it are
// applied.
func TestMalformedEntryIsDeadLettered(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	bad, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{"account", "a", "amount", "ten"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	after, err := queue.Produce(ctx, rdb, "s", "a", 10)
	if err != nil {
		t.Fatal(err)
	}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(&counter{})}
	running(t, ctx, c)
	until(t, 10*time.Second, "the message behind the malformed one applied, nothing pending", func() (bool, error) {
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied WHERE entry_id = $1`, after)
		if err != nil || n != 1 {
			return false, err
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	var fields, why string
	err = db.QueryRowContext(ctx, `SELECT fields, error FROM queue_dead WHERE stream = 's' AND entry_id = $1`, bad).Scan(&fields, &why)
	if errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("malformed entry %s acknowledged but not in queue_dead", bad)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fields, "ten") || why == "" {
		t.Fatalf("dead letter: fields %q, error %q", fields, why)
	}
}
