package pglock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/internal/testmain"
	"github.com/fencekit/fence/pglock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// One PostgreSQL server for the package; each test gets a fresh database.
// Tests that restart or stop the server start their own.
var pg *pgtest.Server

func TestMain(m *testing.M) {
	testmain.Run(m, func() (func(), error) {
		var err error
		if pg, err = pgtest.Launch(); err != nil {
			return nil, err
		}
		return pg.Kill, nil
	})
}

// watchdogTTL is the lease time of the tests' watchdog leases, renewed every
// third of it. 300 ms let CI's load, other packages' tests beside these,
// starve a watchdog past its deadline (ci52: conformance's
// WatchdogKeepsLease saw another Acquire get the lock), as fencerueidis's
// tests saw before.
const watchdogTTL = time.Second

// pgxListener is a pglock.Listener on pgx: one connection per Listen,
// closed when ctx ends.
type pgxListener struct{ dsn string }

func (p pgxListener) Listen(ctx context.Context, channel string) (<-chan string, error) {
	conn, err := pgx.Connect(ctx, p.dsn)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	ch := make(chan string)
	go func() {
		defer close(ch)
		defer func() { _ = conn.Close(context.Background()) }()
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			select {
			case ch <- n.Payload:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// database is a fresh database with the lease table, its DSN, and a handle.
type database struct {
	name, dsn string
	db        *sql.DB
}

func newDatabase(t testing.TB, srv *pgtest.Server) database {
	t.Helper()
	name, err := srv.CreateDatabase(t.Context(), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	d := database{name: name, dsn: srv.DSN(name)}
	d.db = open(t, d.dsn, nil)
	l := d.locker(t, d.db)
	if err := l.EnsureSchema(t.Context()); err != nil {
		t.Fatal(err)
	}
	return d
}

// open returns a *sql.DB on dsn, counting the statements it sends in
// count if count is not nil.
func open(t testing.TB, dsn string, count *atomic.Int64) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var c driver.Connector = stdlib.GetConnector(*cfg)
	if count != nil {
		c = countingConnector{c, count}
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func (d database) locker(t testing.TB, db *sql.DB) *pglock.Locker {
	t.Helper()
	return d.lockerWith(t, db, pglock.Options{})
}

// lockerWith is locker with options o, to which it adds the watchdog TTL and
// the Listener.
func (d database) lockerWith(t testing.TB, db *sql.DB, o pglock.Options) *pglock.Locker {
	t.Helper()
	o.WatchdogTTL, o.Listener = watchdogTTL, pgxListener{d.dsn}
	l, err := pglock.New(db, &o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (d database) remove(t testing.TB, name string) {
	t.Helper()
	if _, err := d.db.ExecContext(context.Background(), `DELETE FROM fence_leases WHERE name = $1`, name); err != nil {
		t.Fatal(err)
	}
}

// countingConnector counts the statements (queries and execs) its
// connections send.
type countingConnector struct {
	driver.Connector
	n *atomic.Int64
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return countingConn{conn.(*stdlib.Conn), c.n}, nil
}

type countingConn struct {
	*stdlib.Conn
	n *atomic.Int64
}

func (c countingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	defer c.n.Add(1) // counted once answered, so a count says what the caller has seen
	return c.Conn.QueryContext(ctx, q, args)
}

func (c countingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	defer c.n.Add(1)
	return c.Conn.ExecContext(ctx, q, args)
}
