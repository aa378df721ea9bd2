package queue_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/redis/go-redis/v9"
)

// TestOldConsumerNewProducerAppliedOnce: producers upgraded before every
// consumer (against the package doc's order). An old consumer, which
// keys every entry by its entry id, applied an entry carrying msg_id and
// died before XACK; the new consumer claims it, keys it by msg_id, finds
// no row and applies it again. The row the old consumer left is told apart
// (entry_id NULL, msg_id the entry id: new consumers write entry_id, and
// ProduceID refuses ids of an entry id's form).
func TestOldConsumerNewProducerAppliedOnce(t *testing.T) {
	t.Skip("design question: a new consumer that also took a row keyed by the entry id with entry_id NULL (an old consumer's) as applied " +
		"would close this upgrade hole, but it would drop, for as long as such rows exist, a new message whose entry id equals a pre-upgrade one " +
		"(a stream reset by a failover to a replica whose clock is behind), the hole message ids were made to close; " +
		"the package doc's rule (upgrade the consumers before the producers) is kept, and this test shows what breaking it costs")
	ctx, rdb, db := servers(t, 30*time.Second)
	entry, err := queue.ProduceID(ctx, rdb, "s", "order-1", "a", 5)
	if err != nil {
		t.Fatal(err)
	}
	// The old consumer read it, applied it keyed by its entry id (the old
	// INSERT names no entry_id), and died before XACK.
	if err := rdb.XGroupCreateMkStream(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "old", Streams: []string{"s", ">"}, Count: 1, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO queue_applied (stream, msg_id, account, amount, token, consumer) VALUES ('s', $1, 'a', 5, 1, 'old')`, entry); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO queue_balance VALUES ('a', 5)`); err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "new",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	until(t, 10*time.Second, "the entry settled", func() (bool, error) {
		state = fmt.Sprintf("%d applied, %d duplicate", logs.get(queue.LogApplied), logs.get(queue.LogDuplicate))
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0 && logs.get(queue.LogApplied)+logs.get(queue.LogDuplicate) == 1, err
	}, &state)
	if n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'a'`); err != nil || n != 5 {
		t.Fatalf("balance %d (%v), want 5: the message applied by the old consumer was applied again (%s)", n, err, state)
	}
}
