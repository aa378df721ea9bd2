package pglock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// lateConnector's connections, while armed, hold a renewal (an UPDATE
// that moves expires_at) with a lease of lateUs microseconds until its
// caller's ctx has ended, then run it on the server and answer with ctx's
// error: a renewal that reached the database, whose reply came too late.
type lateConnector struct {
	driver.Connector
	armed atomic.Bool
	ran   atomic.Int64 // late renewals run
}

const lateUs = int64(30 * time.Second / time.Microsecond)

func (c *lateConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return lateConn{conn.(*stdlib.Conn), c}, nil
}

type lateConn struct {
	*stdlib.Conn
	c *lateConnector
}

func (c lateConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	if c.c.armed.Load() && strings.Contains(q, "SET expires_at = greatest") && len(args) == 3 && args[2].Value == lateUs {
		<-ctx.Done()
		_, err := c.Conn.ExecContext(context.WithoutCancel(ctx), q, args)
		if err != nil {
			return nil, err
		}
		c.c.ran.Add(1)
		return nil, ctx.Err()
	}
	return c.Conn.ExecContext(ctx, q, args)
}

// lateRenewal returns a lease of 2 s whose Extend(30 s) ran on the
// database, moving the row 30 s ahead, but whose reply came after Extend
// gave up (200 ms): Extend failed, the lease kept its deadline, and has
// ended there. It returns the handle that checks the row too.
func lateRenewal(t *testing.T, name string) (fence.Lease, *sql.DB) {
	t.Helper()
	lease, db := lateRenewalHeld(t, name, 2*time.Second)
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	return lease, db
}

// lateRenewalHeld is lateRenewal for a lease of ttl, returned while it is
// still held.
func lateRenewalHeld(t *testing.T, name string, ttl time.Duration) (fence.Lease, *sql.DB) {
	t.Helper()
	d := newDatabase(t, pg)
	late := &lateConnector{}
	cfg, err := pgx.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	late.Connector = stdlib.GetConnector(*cfg)
	db := sql.OpenDB(late)
	t.Cleanup(func() { _ = db.Close() })
	l := d.locker(t, db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	late.armed.Store(true)
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err = lease.Extend(short, 30*time.Second)
	cancel()
	late.armed.Store(false)
	if err == nil || late.ran.Load() != 1 {
		t.Fatalf("the late renewal: Extend = %v with %d run; want a deadline error and 1", err, late.ran.Load())
	}
	if left := rowLeft(t, d.db, name); left < 10*time.Second {
		t.Fatalf("the late renewal left the row %v", left)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("the lease ended before its deadline: %v", err)
	}
	return lease, d.db
}

// rowLeft is how long the row of name is held for by the database's clock
// (0 or less: free).
func rowLeft(t *testing.T, db *sql.DB, name string) time.Duration {
	t.Helper()
	var us int64
	if err := db.QueryRowContext(ctxFor(t, 10*time.Second),
		`SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint FROM fence_leases WHERE name = $1`, name).Scan(&us); err != nil {
		t.Fatal(err)
	}
	return time.Duration(us) * time.Microsecond
}

// TestReleaseAfterLateRenewalFreesRow: a holder that calls Release once its
// lease has ended (a deferred Release) gets the lease's error, and the row,
// still its own (the late renewal moved it 30 s ahead), is freed.
func TestReleaseAfterLateRenewalFreesRow(t *testing.T) {
	const name = "late-renewal-release"
	lease, db := lateRenewal(t, name)
	if err := lease.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of the ended lease = %v, want ErrLeaseLost", err)
	}
	if left := rowLeft(t, db, name); left > 0 {
		t.Fatalf("the row is held for %v more after Release of the ended lease", left)
	}
}

// TestLateRenewalGivenBackAtLeaseEnd: the late renewal moved the row 30 s
// ahead and not the deadline; when the lease ends there, unreleased, the
// row must be freed rather than held by nobody for the rest of the 30 s.
func TestLateRenewalGivenBackAtLeaseEnd(t *testing.T) {
	const name = "late-renewal-linger"
	_, db := lateRenewal(t, name)
	awaitRowFree(t, db, name, 5*time.Second, "the lease ended at its deadline")
}

// awaitRowFree waits up to within for the row of name to be free, and
// fails naming what it came after ("the lease ended at its deadline").
func awaitRowFree(t *testing.T, db *sql.DB, name string, within time.Duration, after string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		left := rowLeft(t, db, name)
		if left <= 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the row is held for %v more, %v after %s", left, within, after)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}
