package queue_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
)

// TestSameIDTwiceInOneTermKeepsLease: ProduceID's retry with the same id
// (the package's advice after an error) leaves two entries with one
// message id. The leader applied the first and fenced the second, in the
// same term, with the same token on the same guard resource: guard refuses
// a token it already accepted ("guard: stale token T for queue:s:order-1:
// token T already accepted"), and the consumer took its own earlier commit
// for a newer leader's: it logged "rejected", ended its term with
// fence.ErrLeaseLost ("a newer leader had ...") and gave its lease up; the
// next term, with a new token, found the message applied (2 elections, 1
// rejected, for one leader and nobody else). Every such retry cost a term.
// The leader must find the message applied and go on in its term.
func TestSameIDTwiceInOneTermKeepsLease(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	for range 2 {
		if _, err := queue.ProduceID(ctx, rdb, "s", "order-1", "a", 5); err != nil {
			t.Fatal(err)
		}
	}
	after, err := queue.ProduceID(ctx, rdb, "s", "order-2", "a", 100)
	if err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	seen := func() string {
		return fmt.Sprintf("%d elected, %d applied, %d duplicate, %d rejected, %d terms ended", logs.get(queue.LogElected),
			logs.get(queue.LogApplied), logs.get(queue.LogDuplicate), logs.get(queue.LogRejected), logs.get(queue.LogTermEnded))
	}
	until(t, 10*time.Second, "the three entries settled", func() (bool, error) {
		state = seen()
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied WHERE entry_id = $1`, after)
		if err != nil || n != 1 {
			return false, err
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	if n, err := count(ctx, db, `SELECT balance FROM queue_balance WHERE account = 'a'`); err != nil || n != 105 {
		t.Fatalf("balance %d (%v), want 105 (%s)", n, err, state)
	}
	state = seen()
	if logs.get(queue.LogElected) != 1 || logs.get(queue.LogRejected) != 0 || logs.get(queue.LogDuplicate) != 1 {
		t.Fatalf("%s; want 1 election, no rejection, 1 duplicate: the leader took its own commit for a newer leader's", state)
	}
}
