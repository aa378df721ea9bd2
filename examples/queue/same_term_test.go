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

// TestMalformedEntryOfAppliedIDInOneTerm: an entry written by hand with the
// id of a message the leader applied earlier in its term, and no integer
// amount, is malformed, and its dead letter is fenced with the leader's
// token on the message's resource, which guard refuses as already
// accepted. Before the leader knew its own token's refusals, that ended
// its term, and the next term's dead letter found the id applied and
// logged "dead" (2 elected, 1 applied, 0 duplicate, 1 dead, 1 terms
// ended); since, it acknowledged the entry (the message is done) and
// logged nothing of it (1 elected, 1 applied, 0 duplicate, 0 dead), the
// entry vanishing from the log. It must log a duplicate, and keep its
// term.
func TestMalformedEntryOfAppliedIDInOneTerm(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	if _, err := queue.ProduceID(ctx, rdb, "s", "order-1", "a", 5); err != nil {
		t.Fatal(err)
	}
	bad, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []any{queue.IDField, "order-1", "account", "a", "amount", "ten"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	seen := func() string {
		return fmt.Sprintf("%d elected, %d applied, %d duplicate, %d dead, %d terms ended", logs.get(queue.LogElected),
			logs.get(queue.LogApplied), logs.get(queue.LogDuplicate), logs.get(queue.LogDead), logs.get(queue.LogTermEnded))
	}
	state := seen()
	until(t, 10*time.Second, "both entries acknowledged", func() (bool, error) {
		state = seen()
		if logs.get(queue.LogApplied) == 0 {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	if n, err := count(ctx, db, `SELECT count(*) FROM queue_dead`); err != nil || n != 0 {
		t.Fatalf("%d dead letters (%v) for an applied id", n, err)
	}
	if logs.get(queue.LogElected) != 1 || logs.get(queue.LogDuplicate) != 1 || logs.get(queue.LogDead) != 0 {
		t.Fatalf("malformed entry %s of the applied id: %s; want 1 election, 1 duplicate, no dead", bad, seen())
	}
}
