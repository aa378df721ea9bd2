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
// cuts it. Time-outs count toward MaxDeliveries, so the message is given
// up on and the one behind it applied. With time-outs left uncounted
// (ab08900, reverted) the message was tried for ever, each failed try
// ended the term, and the next term claimed it first again: "no balance
// of a (47 failed, 0 dead, 0 applied) within 15s" (MaxDeliveries 2,
// TxTimeout 300 ms). A row lock is told apart from a table locked for
// maintenance, whose failures are not counted
// (TestLockedTableDoesNotKillMessages).
func TestMessageThatAlwaysTimesOutDoesNotStallTheQueue(t *testing.T) {
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
