package queue_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
)

// TestMessageThatAlwaysTimesOutDoesNotStallTheQueue: one account's row of
// queue_balance is locked by a session that never ends its transaction
// (idle in transaction, forgotten by an operator or a crashed tool). Every
// try of the message on that account waits for the lock until TxTimeout
// cuts it, and a time-out is not counted toward MaxDeliveries
// (TestLockedTableDoesNotKillMessages): the message is tried for ever, each
// failed try ends the term, and the next term claims it first again, so no
// message behind it is ever applied ("no balance of a (47 failed, 0 dead,
// 0 applied) within 15s", MaxDeliveries 2, TxTimeout 300 ms). Before
// time-outs went uncounted the message was dead on its second try and the
// one behind it applied.
//
// Skipped as a design question: from the consumer a lock on one row and a
// lock on the whole table (TestLockedTableDoesNotKillMessages) look the
// same, a time-out. Counting them kills every message of a locked table;
// not counting them lets one message stall the stream for good. Ways out
// (a separate, larger limit for time-outs; leaving a timed-out message
// pending and going on with the next ones, which gives up the stream's
// order) change what MaxDeliveries promises.
func TestMessageThatAlwaysTimesOutDoesNotStallTheQueue(t *testing.T) {
	t.Skip("design question: a message whose own transaction always times out (a row lock never released) is retried for ever, uncounted, and stalls every message behind it; counting time-outs killed every message of a table locked for maintenance")
	ctx, rdb, db := servers(t, 60*time.Second)
	if _, err := db.ExecContext(ctx, `INSERT INTO queue_balance (account, balance) VALUES ('stuck', 0)`); err != nil {
		t.Fatal(err)
	}
	forgotten, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer forgotten.Rollback()
	if _, err := forgotten.ExecContext(ctx, `SELECT 1 FROM queue_balance WHERE account = 'stuck' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.ProduceID(ctx, rdb, "s", "order-1", "stuck", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.ProduceID(ctx, rdb, "s", "order-2", "a", 7); err != nil {
		t.Fatal(err)
	}
	logs := &counter{}
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Minute, Block: 50 * time.Millisecond, MaxDeliveries: 2,
		TxTimeout: 300 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
	var state string
	until(t, 15*time.Second, "balance of a", func() (bool, error) {
		state = fmt.Sprintf("%d failed, %d dead, %d applied", logs.get(queue.LogFailed), logs.get(queue.LogDead), logs.get(queue.LogApplied))
		n, err := count(ctx, db, `SELECT coalesce(sum(balance), 0) FROM queue_balance WHERE account = 'a'`)
		return n == 7, err
	}, &state)
}
