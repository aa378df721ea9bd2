package queue_test

import (
	"context"
	"database/sql"
	"fmt"
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

// TestReusedIDWithOtherContentDeadLettered: a producer whose ids repeat
// for different messages (a counter that starts over when the process
// restarts: "payment:1:approve" again, for another payment) sends messages
// with an applied one's id and another account and amount. Before, the
// consumer keyed on the id alone: they were taken for redeliveries,
// acknowledged, and their effects dropped (balances of b and c 0, want
// them given up on; 1 applied, 4 duplicate, 0 dead; no dead letter), with
// nothing but INFO "duplicate" lines. Each must be given up on
// (queue_dead, an error naming both contents, "dead" logged), once per
// content: a retry of the first message (a, 5) is still a duplicate, and
// so is a retry of the reused one (b, 7). All five are in one term, so the
// later ones meet the fence the leader's own token already passed.
func TestReusedIDWithOtherContentDeadLettered(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	entries := map[string]string{}
	for _, m := range []struct {
		account string
		amount  int64
	}{{"a", 5}, {"b", 7}, {"a", 5}, {"c", 9}, {"b", 7}} {
		id, err := queue.ProduceID(ctx, rdb, "s", "payment:1:approve", m.account, m.amount)
		if err != nil {
			t.Fatal(err)
		}
		if k := fmt.Sprint(m.account, " ", m.amount); entries[k] == "" {
			entries[k] = id // the first entry of each content
		}
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
	until(t, 10*time.Second, "all five entries settled", func() (bool, error) {
		state = seen()
		if logs.get(queue.LogApplied)+logs.get(queue.LogDuplicate)+logs.get(queue.LogDead) < 5 {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	for account, want := range map[string]int64{"a": 5, "b": 0, "c": 0} {
		if n, err := count(ctx, db, `SELECT coalesce(sum(balance), 0) FROM queue_balance WHERE account = $1`, account); err != nil || n != want {
			t.Fatalf("balance of %s %d (%v), want %d (%s)", account, n, err, want, seen())
		}
	}
	if logs.get(queue.LogElected) != 1 || logs.get(queue.LogApplied) != 1 || logs.get(queue.LogDuplicate) != 2 || logs.get(queue.LogDead) != 2 {
		t.Fatalf("%s; want 1 elected, 1 applied, 2 duplicate (the retries), 2 dead (the reuses)", seen())
	}
	delete(entries, "a 5")
	deadLetters(t, ctx, db, entries)
}

// TestReusedIDInLaterTermDeadLetteredOnceOnReplay: as above, but the
// message with the reused id comes in a later term (another consumer,
// another token), so that its own transaction finds the id applied.
// Before, it was dropped as a duplicate (balance of b 0, 0 dead, 1
// duplicate). Then an operator replays the stream (XGROUP SETID 0, the
// entries kept): the reused message must not be applied under its id, nor
// recorded twice, nor loop; both entries are found done and acknowledged.
func TestReusedIDInLaterTermDeadLetteredOnceOnReplay(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	if _, err := queue.ProduceID(ctx, rdb, "s", "payment:1:approve", "a", 5); err != nil {
		t.Fatal(err)
	}
	locker, err := redislock.New(rdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	consumer := func(name string) *queue.Consumer {
		return &queue.Consumer{KeepEntries: true, Redis: rdb, DB: db, Stream: "s", Group: "g", Name: name,
			MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	}
	firstCtx, stopFirst := context.WithCancel(ctx)
	firstDone := make(chan error, 1)
	go func() { firstDone <- consumer("c1").Run(firstCtx, locker) }()
	// Applied and acknowledged: LogApplied comes before the XACK, which
	// the stop could cut, and the entry then came back to the next
	// consumer as a duplicate ("1 duplicate, 1 dead", in a full run).
	until(t, 10*time.Second, "the first message applied and acknowledged", func() (bool, error) {
		if logs.get(queue.LogApplied) != 1 {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	})
	stopFirst()
	<-firstDone // its lease released: the next consumer's term has a new token
	reused, err := queue.ProduceID(ctx, rdb, "s", "payment:1:approve", "b", 7)
	if err != nil {
		t.Fatal(err)
	}
	running(t, ctx, consumer("c2"), fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	seen := func() string {
		return fmt.Sprintf("%d elected, %d applied, %d duplicate, %d dead, %d terms ended", logs.get(queue.LogElected),
			logs.get(queue.LogApplied), logs.get(queue.LogDuplicate), logs.get(queue.LogDead), logs.get(queue.LogTermEnded))
	}
	state := seen()
	settled := func(handled int) func() (bool, error) {
		return func() (bool, error) {
			state = seen()
			if logs.get(queue.LogApplied)+logs.get(queue.LogDuplicate)+logs.get(queue.LogDead) < handled {
				return false, nil
			}
			p, err := pending(ctx, rdb, "s", "g")
			return p == 0, err
		}
	}
	until(t, 10*time.Second, "the reused message settled", settled(2), &state)
	if n, err := count(ctx, db, `SELECT coalesce(sum(balance), 0) FROM queue_balance WHERE account = 'b'`); err != nil || n != 0 {
		t.Fatalf("balance of b %d (%v), want 0 (%s)", n, err, seen())
	}
	if logs.get(queue.LogDead) != 1 {
		t.Fatalf("%s; want 1 dead", seen())
	}
	deadLetters(t, ctx, db, map[string]string{"b 7": reused})
	if err := rdb.XGroupSetID(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "the replay settled", settled(4), &state)
	deadLetters(t, ctx, db, map[string]string{"b 7": reused})
	for account, want := range map[string]int64{"a": 5, "b": 0} {
		if n, err := count(ctx, db, `SELECT coalesce(sum(balance), 0) FROM queue_balance WHERE account = $1`, account); err != nil || n != want {
			t.Fatalf("balance of %s %d (%v), want %d after the replay (%s)", account, n, err, want, seen())
		}
	}
	// At least the replay's 2: on a loaded machine a replayed entry may
	// also be claimed again (idle past MinIdle) before its XACK, and each
	// delivery of a done message is logged a duplicate (seen once in a
	// whole-package run: 3).
	if logs.get(queue.LogApplied) != 1 || logs.get(queue.LogDuplicate) < 2 || logs.get(queue.LogDead) != 1 {
		t.Fatalf("%s; want 1 applied, 1 dead, and the replay's 2 duplicates or more", seen())
	}
}

// deadLetters checks that queue_dead holds one dead letter per entry of
// entries (account, amount and entry id) and no other, each with an error
// that says the message id was applied with other content and names both:
// the applied one, account "a" and amount 5, and the entry's.
func deadLetters(t *testing.T, ctx context.Context, db *sql.DB, entries map[string]string) {
	t.Helper()
	rows, err := db.QueryContext(ctx, `SELECT entry_id, error FROM queue_dead`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var entry, msg string
		if err := rows.Scan(&entry, &msg); err != nil {
			t.Fatal(err)
		}
		got[entry] = msg
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(entries) {
		t.Fatalf("dead letters %q; want one for each of %v", got, entries)
	}
	for content, entry := range entries {
		msg, ok := got[entry]
		if !ok {
			t.Fatalf("no dead letter for entry %s (%s); dead letters %q", entry, content, got)
		}
		account, amount, _ := strings.Cut(content, " ")
		for _, part := range []string{"applied with other content", `"a"`, " 5", strconv.Quote(account), " " + amount} {
			if !strings.Contains(msg, part) {
				t.Errorf("dead letter of entry %s (%s): error %q does not hold %q", entry, content, msg, part)
			}
		}
	}
}

// TestReusedEntryIDOfOldRowDeadLettered: a row from before entry_id (NULL;
// its key, the entry id, was the only key) is compared too. A stream that
// started over gives an entry without a message id the entry id of that
// row, with another account and amount: before, it was dropped as a
// duplicate (balance of b 0, 1 duplicate, 0 dead); it must be given up
// on, its error naming the row's content and its own.
func TestReusedEntryIDOfOldRowDeadLettered(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	if _, err := db.ExecContext(ctx, `INSERT INTO queue_applied (stream, msg_id, entry_id, account, amount, token, consumer)
VALUES ('s', '1-1', NULL, 'a', 5, 1, 'old')`); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "s", ID: "1-1", Values: []any{"account", "b", "amount", 7}}).Err(); err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	seen := func() string {
		return fmt.Sprintf("%d applied, %d duplicate, %d dead", logs.get(queue.LogApplied), logs.get(queue.LogDuplicate), logs.get(queue.LogDead))
	}
	state := seen()
	until(t, 10*time.Second, "the entry settled", func() (bool, error) {
		state = seen()
		if logs.get(queue.LogDuplicate)+logs.get(queue.LogDead) == 0 {
			return false, nil
		}
		p, err := pending(ctx, rdb, "s", "g")
		return p == 0, err
	}, &state)
	if logs.get(queue.LogDead) != 1 {
		t.Fatalf("%s; want 1 dead", seen())
	}
	deadLetters(t, ctx, db, map[string]string{"b 7": "1-1"})
	if n, err := count(ctx, db, `SELECT coalesce(sum(balance), 0) FROM queue_balance WHERE account = 'b'`); err != nil || n != 0 {
		t.Fatalf("balance of b %d (%v), want 0", n, err)
	}
}
