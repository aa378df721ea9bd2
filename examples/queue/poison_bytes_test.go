package queue_test

import (
	"database/sql"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/redis/go-redis/v9"
)

// TestUnstorableBytesAreDeadLettered: a stream entry's fields are bytes,
// and PostgreSQL's text is UTF-8 without NUL. An entry whose account holds
// a NUL or invalid UTF-8 fails its transaction on every delivery; so did
// its dead letter, which copied the same bytes into queue_dead's fields
// (and, for a malformed entry, into the error, which quotes the fields).
// The entry then stayed pending for ever, claimed first by every term,
// failing it: the messages behind it were never applied, the queue stood
// still, as for the poison message before queue_dead. Such entries must
// be dead-lettered, with their bytes escaped, and the queue go on.
func TestUnstorableBytesAreDeadLettered(t *testing.T) {
	ctx, rdb, db := servers(t, 60*time.Second)
	var bad []string
	for _, values := range [][]any{
		{"account", "a\x00b", "amount", "1"},             // NUL: valid, then unstorable
		{"account", "caf\xe9", "amount", "2"},            // Latin-1, not UTF-8
		{"account", "x", "amount", "t\xffen"},            // malformed, and not UTF-8
		{"account", "y", "amount\x00", "3", "z", "\x00"}, // malformed, NUL in a field name
	} {
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: values}).Result()
		if err != nil {
			t.Fatal(err)
		}
		bad = append(bad, id)
	}
	after, err := queue.Produce(ctx, rdb, "s", "ok", 7)
	if err != nil {
		t.Fatal(err)
	}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, MaxDeliveries: 2, Log: slog.New(&counter{})}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))

	until(t, 20*time.Second, "the message behind the unstorable ones applied, nothing pending", func() (bool, error) {
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied WHERE entry_id = $1`, after)
		if err != nil || n != 1 {
			return false, err
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	for _, id := range bad {
		var fields, why string
		err := db.QueryRowContext(ctx, `SELECT fields, error FROM queue_dead WHERE stream = 's' AND entry_id = $1`, id).Scan(&fields, &why)
		if errors.Is(err, sql.ErrNoRows) {
			t.Errorf("entry %s acknowledged but not in queue_dead", id)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if fields == "" || why == "" {
			t.Errorf("dead letter %s: fields %q, error %q", id, fields, why)
		}
	}
	if n, err := count(ctx, db, `SELECT count(*) FROM queue_applied`); err != nil || n != 1 {
		t.Fatalf("%d messages applied (%v); want 1", n, err)
	}
}
