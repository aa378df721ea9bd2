package queue_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestTrimmedUnreadEntriesNoticed: the consumers were down (or fell
// behind) and a producer bounded the stream with XADD MAXLEN, trimming
// entries that the group had not read yet. Those were never pending, so
// XAUTOCLAIM never reports them and the set of trimmed ids never holds
// them: 4 of 6 messages gone, no dead letter, nothing logged (log:
// [elected applied applied]). The package doc says pending
// entries trimmed by others "are not silently lost"; unread ones are.
// Redis 7 can tell (XINFO STREAM's max-deleted-entry-id above the group's
// last-delivered-id: an entry the group never read was deleted), though
// not which ids. Now logged at ERROR (LogUnread), with the ids that bound
// them.
func TestTrimmedUnreadEntriesNoticed(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	// The consumer ran once, and made its group; then it was down.
	first := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c0",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(&records{})}
	firstCtx, stopFirst := context.WithCancel(ctx)
	firstDone := make(chan error, 1)
	l, err := redislock.New(rdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { firstDone <- first.Run(firstCtx, l) }()
	until(t, 10*time.Second, "the group made", func() (bool, error) {
		groups, err := rdb.XInfoGroups(ctx, "s").Result()
		return err == nil && len(groups) == 1, nil
	})
	stopFirst()
	<-firstDone
	// Its last XREADGROUP, given up on, may still be blocked in Redis: an
	// entry produced now would be delivered to it, pending, and told as
	// trimmed while pending, not unread.
	until(t, 10*time.Second, "no read of the first consumer blocked", func() (bool, error) {
		info, err := rdb.Info(ctx, "clients").Result()
		return strings.Contains(info, "blocked_clients:0\r\n"), err
	})
	for i := range 5 {
		if _, err := queue.Produce(ctx, rdb, "s", "a", int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	// A producer of its own that bounds the stream.
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", MaxLen: 2, Values: []any{queue.IDField, "own:1", "account", "a", "amount", 100}}).Err(); err != nil {
		t.Fatal(err)
	}
	logs := &records{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	until(t, 10*time.Second, "the entries left applied, nothing pending", func() (bool, error) {
		state = logs.String()
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied`)
		if err != nil || n != 2 {
			return false, err
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	until(t, 5*time.Second, "a record of the entries trimmed unread", func() (bool, error) {
		state = logs.String()
		return logs.has(queue.LogUnread, "4 entries of stream"), nil
	}, &state)
	// Told once, not at every read.
	if n := logs.count(queue.LogUnread); n != 1 {
		t.Errorf("%d %q records, want 1: %s", n, queue.LogUnread, logs)
	}
}

// TestDeletedUnreadEntryNoticed: an operator's XDEL of an entry the group
// had not read yet is told too (max-deleted-entry-id past the group's
// last delivered), without a count.
func TestDeletedUnreadEntryNoticed(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	if err := rdb.XGroupCreateMkStream(ctx, "s", "g", "$").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := queue.Produce(ctx, rdb, "s", "a", int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := rdb.XRange(ctx, "s", "-", "+").Result()
	if err != nil || len(entries) != 3 {
		t.Fatalf("XRANGE: %v, %d entries", err, len(entries))
	}
	if err := rdb.XDel(ctx, "s", entries[1].ID).Err(); err != nil {
		t.Fatal(err)
	}
	logs := &records{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	until(t, 10*time.Second, "the deletion told and the 2 left applied", func() (bool, error) {
		state = logs.String()
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied`)
		return n == 2 && logs.has(queue.LogUnread, "up to "+entries[1].ID), err
	}, &state)
}

// TestOwnTrimNotTakenForUnread: the consumer's own trim deletes what the
// group read and acknowledged, in batches, down to an empty stream, and
// entries come after it: nothing was lost, and nothing is told.
func TestOwnTrimNotTakenForUnread(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	logs := &records{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1", Batch: 2,
		MinIdle: time.Second, Block: 20 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	for round := 1; round <= 3; round++ {
		for i := range 5 {
			if _, err := queue.Produce(ctx, rdb, "s", "a", int64(i+1)); err != nil {
				t.Fatal(err)
			}
		}
		until(t, 10*time.Second, "every entry applied and trimmed", func() (bool, error) {
			state = logs.String()
			n, err := count(ctx, db, `SELECT count(*) FROM queue_applied`)
			if err != nil || n != int64(5*round) {
				return false, err
			}
			l, err := rdb.XLen(ctx, "s").Result()
			return l == 0, err
		}, &state)
	}
	if logs.count(queue.LogUnread) != 0 {
		t.Errorf("the consumer's own trim was told as entries trimmed unread: %s", logs)
	}
}

// TestReplayFromStartNotTakenForUnread: the consumer applied 5 messages
// and its own trim emptied the stream; an operator then moved the group
// back for a replay (XGROUP SETID s g 0, as the Consumer's doc allows).
// Nothing was lost, yet LogUnread said "5 entries of stream "s" after 0-0
// ... were trimmed before group "g" read them: their messages are lost":
// SETID without ENTRIESREAD leaves entries-read unknown, and the script
// takes an unknown count at last-delivered-id 0-0 for 0 read, which is
// right for a group created at 0 that never read (how
// TestTrimmedUnreadEntriesNoticed's producer trim is counted) and wrong
// for one moved back there. Redis 7.0 shows both alike (entries-read nil,
// last-delivered-id 0-0, the consumers of the group kept either way).
// Now the consumer creates its group with ENTRIESREAD 0, and an unknown
// count is not counted.
func TestReplayFromStartNotTakenForUnread(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	logs := &records{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1", Batch: 2,
		MinIdle: time.Second, Block: 20 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	for i := range 5 {
		if _, err := queue.Produce(ctx, rdb, "s", "a", int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	var state string
	until(t, 10*time.Second, "every entry applied and trimmed", func() (bool, error) {
		state = logs.String()
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied`)
		if err != nil || n != 5 {
			return false, err
		}
		l, err := rdb.XLen(ctx, "s").Result()
		return l == 0, err
	}, &state)
	// The operator's replay. The consumer looks for unread deletions
	// (XINFO STREAM, in its script) before each XREADGROUP: two looks
	// counted after the replay mean that one came after it and was
	// logged, if it found anything, before the second began.
	if err := rdb.XGroupSetID(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	looks := func() (int64, error) {
		info, err := rdb.Info(ctx, "commandstats").Result()
		_, after, _ := strings.Cut(info, "cmdstat_xinfo|stream:calls=")
		n, _ := strconv.ParseInt(after[:strings.IndexByte(after+",", ',')], 10, 64)
		return n, err
	}
	before, err := looks()
	if err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "two looks for unread deletions after the replay", func() (bool, error) {
		state = logs.String()
		n, err := looks()
		return n > before+1, err
	}, &state)
	if n := logs.count(queue.LogUnread); n != 0 {
		t.Errorf("a replay after the consumer's own trims was told as %d loss(es): %s", n, logs)
	}
}
