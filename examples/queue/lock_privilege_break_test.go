package queue_test

import (
	"fmt"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
)

// TestPoisonDeadLetteredWithColumnPrivileges: the consumer runs as a role
// granted what applying needs and no more, column by column on the effect
// tables (INSERT of queue_applied's columns, UPDATE of balance).
// PostgreSQL's LOCK TABLE looks at table privileges only, so giveUp's
// "LOCK TABLE queue_applied, queue_balance IN ROW EXCLUSIVE MODE NOWAIT"
// was refused ("permission denied for table queue_applied", SQLSTATE
// 42501) at every failure, and taken for a maintenance lock: no failure
// was counted, the poison message was tried for ever, each try ended the
// term, and the message behind it was never applied ("no the message
// behind the poison applied within 20s (23 failed, 0 dead, 1 applied)").
func TestPoisonDeadLetteredWithColumnPrivileges(t *testing.T) {
	ctx, rdb, db := servers(t, 60*time.Second)
	asRoleGranted(t, ctx, db,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON queue_dead, queue_failures, fence_tokens, fence_idempotency`,
		`GRANT SELECT, INSERT (stream, msg_id, entry_id, account, amount, token, consumer) ON queue_applied`,
		`GRANT SELECT, INSERT (account, balance), UPDATE (balance) ON queue_balance`)
	if _, err := queue.Produce(ctx, rdb, "s", "big", math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.Produce(ctx, rdb, "s", "big", 1); err != nil { // overflows: poison
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
	var state string
	until(t, 20*time.Second, "the message behind the poison applied", func() (bool, error) {
		state = fmt.Sprintf("%d failed, %d dead, %d applied", logs.get(queue.LogFailed), logs.get(queue.LogDead), logs.get(queue.LogApplied))
		n, err := count(ctx, db, `SELECT count(*) FROM queue_applied WHERE entry_id = $1`, after)
		return n == 1, err
	}, &state)
	if logs.get(queue.LogDead) != 1 {
		t.Fatalf("%d dead logged, want 1 (the poison)", logs.get(queue.LogDead))
	}
}
