package queue_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
)

// TestLockedTableDoesNotKillMessages: maintenance takes queue_balance's
// table lock for a while (VACUUM FULL, ALTER TABLE, CREATE INDEX without
// CONCURRENTLY). Every message's transaction then waits for it, until
// TxTimeout cuts it or, on a database with a lock_timeout, PostgreSQL
// gives up the wait (55P03, guard.ErrRetry). The consumer counted each as
// a failed try of the message and, its dead letter touching other tables,
// gave the message up on its MaxDeliveries-th: acknowledged, its effect
// never applied once the lock was gone (1 failed, 1 dead, balance 0, want
// 7; the dead letter's error "timeout: context deadline exceeded", or
// "guard: transaction conflict, retry with a new lease: ERROR: canceling
// statement due to lock timeout (SQLSTATE
// 55P03)"). A time-out or a conflict is the database's failure, not the
// message's: like a database that is down, it must leave the message
// pending, uncounted. giveUp now looks in pg_locks for a lock on the
// effect's tables that conflicts with a try's before it counts a failure,
// and counts nothing when there is one.
func TestLockedTableDoesNotKillMessages(t *testing.T) {
	for name, params := range map[string]string{"TxTimeout": "", "lock_timeout": "&lock_timeout=100"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			rdb := redistest.Start(t).Client(t)
			dbName, err := pg.CreateDatabase(ctx, t.Name())
			if err != nil {
				t.Fatal(err)
			}
			db, err := sql.Open("pgx", pg.DSN(dbName)+params)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			if err := queue.CreateSchema(ctx, db); err != nil {
				t.Fatal(err)
			}
			maintenance, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer maintenance.Rollback()
			if _, err := maintenance.ExecContext(ctx, `LOCK TABLE queue_balance IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			if _, err := queue.ProduceID(ctx, rdb, "s", "order-1", "a", 7); err != nil {
				t.Fatal(err)
			}
			logs := &counter{}
			c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
				MinIdle: time.Minute, Block: 50 * time.Millisecond, MaxDeliveries: 2,
				TxTimeout: 300 * time.Millisecond, Log: slog.New(logs)}
			running(t, ctx, c, fence.Backoff(10*time.Millisecond, 50*time.Millisecond))
			var state string
			seen := func() string {
				return fmt.Sprintf("%d failed, %d dead, %d applied", logs.get(queue.LogFailed), logs.get(queue.LogDead), logs.get(queue.LogApplied))
			}
			until(t, 20*time.Second, "more failed tries than MaxDeliveries, or a dead letter", func() (bool, error) {
				state = seen()
				return logs.get(queue.LogFailed) > c.MaxDeliveries || logs.get(queue.LogDead) > 0, nil
			}, &state)
			if err := maintenance.Rollback(); err != nil {
				t.Fatal(err)
			}
			until(t, 10*time.Second, "the message settled", func() (bool, error) {
				state = seen()
				p, err := pending(ctx, rdb, "s", "g")
				return p == 0, err
			}, &state)
			var why string
			_ = db.QueryRowContext(ctx, `SELECT error FROM queue_dead WHERE msg_id = 'order-1'`).Scan(&why)
			if n, err := count(ctx, db, `SELECT coalesce(sum(balance), 0) FROM queue_balance WHERE account = 'a'`); err != nil || n != 7 {
				t.Fatalf("balance %d (%v), want 7: %s; dead letter's error %q", n, err, seen(), why)
			}
		})
	}
}
