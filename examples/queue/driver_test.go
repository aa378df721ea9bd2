package queue_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/jackc/pgx/v5/stdlib"
)

// plainConnector opens pgx connections whose errors are bare strings,
// as with a driver whose error type has no SQLState method or a layer that
// flattens errors.
type plainConnector struct{ dsn string }

func (c plainConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := stdlib.GetDefaultDriver().Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return plainConn{conn}, nil
}

func (c plainConnector) Driver() driver.Driver { return stdlib.GetDefaultDriver() }

type plainConn struct{ driver.Conn }

func plain(err error) error {
	if err == nil || errors.Is(err, driver.ErrSkip) || errors.Is(err, driver.ErrBadConn) {
		return err
	}
	return errors.New(err.Error())
}

func (c plainConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c plainConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
	return r, plain(err)
}

func (c plainConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
	return r, plain(err)
}

// With a driver whose errors do not carry SQLSTATE, a redelivered message
// is still found applied: a duplicate, acknowledged, not a failure. Before,
// the duplicate was known only by the unique violation's SQLState(): each
// redelivered message failed and ended the term.
func TestRedeliveredWithPlainDriverErrors(t *testing.T) {
	const n = 5
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rdb := redistest.Start(t).Client(t)
	name, err := pg.CreateDatabase(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(plainConnector{pg.DSN(name)})
	t.Cleanup(func() { _ = db.Close() })
	if err := queue.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	// The wrapper does flatten: a unique violation has no SQLState.
	if _, err := db.ExecContext(ctx, `CREATE TEMP TABLE u (k int PRIMARY KEY); INSERT INTO u VALUES (1), (1)`); err == nil {
		t.Fatal("no unique violation")
	} else if _, ok := err.(interface{ SQLState() string }); ok || errors.Unwrap(err) != nil {
		t.Fatalf("error not flattened: %T %v", err, err)
	}
	for i := 1; i <= n; i++ {
		if _, err := queue.Produce(ctx, rdb, "s", fmt.Sprintf("acct-%d", i%2), int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	logs := &counter{}
	c := &queue.Consumer{KeepEntries: true, Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1",
		MinIdle: time.Second, Block: 50 * time.Millisecond, Log: slog.New(logs)}
	running(t, ctx, c)
	settled := func(dups int) func() (bool, error) {
		return func() (bool, error) {
			if logs.get(queue.LogFailed) > 0 || logs.get(queue.LogDead) > 0 {
				return false, fmt.Errorf("%d failed, %d dead logged", logs.get(queue.LogFailed), logs.get(queue.LogDead))
			}
			if logs.get(queue.LogApplied) != n || logs.get(queue.LogDuplicate) != dups {
				return false, nil
			}
			p, err := pending(ctx, rdb, "s", "g")
			return p == 0, err
		}
	}
	until(t, 10*time.Second, "first delivery applied", settled(0))
	if err := rdb.XGroupSetID(ctx, "s", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	until(t, 10*time.Second, "redelivery found applied", settled(n))
	if sum, err := count(ctx, db, `SELECT sum(balance) FROM queue_balance`); err != nil || sum != n*(n+1)/2 {
		t.Fatalf("balance %d (%v), want %d", sum, err, n*(n+1)/2)
	}
}
