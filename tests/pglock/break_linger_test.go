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

// slowReplyConnector's connections, while a lease is set, run a renewal
// with a lease of lateUs microseconds at once but hold its (successful)
// reply until that lease has ended: a renewal that ran on the database in
// time, whose answer came after the local deadline, to a caller that had
// not given up on it.
type slowReplyConnector struct {
	driver.Connector
	lease atomic.Pointer[fence.Lease]
	ran   atomic.Int64
}

func (c *slowReplyConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return slowReplyConn{conn.(*stdlib.Conn), c}, nil
}

type slowReplyConn struct {
	*stdlib.Conn
	c *slowReplyConnector
}

func (c slowReplyConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	lp := c.c.lease.Load()
	if lp == nil || !strings.Contains(q, "SET expires_at = greatest") || len(args) != 3 || args[2].Value != lateUs {
		return c.Conn.ExecContext(ctx, q, args)
	}
	res, err := c.Conn.ExecContext(ctx, q, args)
	if err != nil {
		return nil, err
	}
	c.c.ran.Add(1)
	select {
	case <-(*lp).Done():
	case <-time.After(10 * time.Second):
	}
	return res, nil
}

// TestSlowRenewalReplyGivenBackAtLeaseEnd: an Extend(30 s) that ran on the
// database before the lease's deadline, but whose reply arrived after the
// lease had ended there, moved the row 30 s ahead for a lease nobody holds.
// The row must be freed (owner-checked), not held by nobody for 28 s more,
// as it is when the reply is lost (TestLateRenewalGivenBackAtLeaseEnd).
func TestSlowRenewalReplyGivenBackAtLeaseEnd(t *testing.T) {
	const name = "slow-renewal-reply"
	d := newDatabase(t, pg)
	slow := &slowReplyConnector{}
	cfg, err := pgx.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	slow.Connector = stdlib.GetConnector(*cfg)
	db := sql.OpenDB(slow)
	t.Cleanup(func() { _ = db.Close() })
	l := d.locker(t, db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	slow.lease.Store(&lease)
	err = lease.Extend(ctxFor(t, 20*time.Second), 30*time.Second)
	slow.lease.Store(nil)
	if err == nil || slow.ran.Load() != 1 {
		t.Fatalf("Extend whose reply came after the lease ended = %v with %d run; want an error and 1", err, slow.ran.Load())
	}
	if lease.Err() == nil {
		t.Fatal("the lease is still held")
	}
	awaitRowFree(t, d.db, name, 5*time.Second, "the lease ended at its deadline")
}

// TestFailedReleaseAfterLateRenewalFreesRow: a lease whose Extend(30 s) ran
// on the database after Extend gave up on it (the lease still held) has its
// row 30 s ahead of its deadline. A Release that fails (its ctx already
// done, as a deferred Release with a request's ctx) ends the lease without
// freeing the row: the row must then be freed as when the lease ends
// unreleased, not held by nobody for the rest of the 30 s.
func TestFailedReleaseAfterLateRenewalFreesRow(t *testing.T) {
	const name = "failed-release-late-renewal"
	lease, db := lateRenewalHeld(t, name, 5*time.Second)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lease.Release(done); err == nil {
		t.Fatal("Release with a done ctx returned nil")
	}
	awaitRowFree(t, db, name, 3*time.Second, "a failed Release ended the lease")
}

// hungConnector's connections, while armed, hold every release statement
// until its ctx ends or the test lets it go: a database that no longer
// answers (a partition), as a driver sees it when ctx has no deadline.
type hungConnector struct {
	driver.Connector
	armed atomic.Bool
	let   chan struct{}
	held  atomic.Int64
}

func (c *hungConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return hungConn{conn.(*stdlib.Conn), c}, nil
}

type hungConn struct {
	*stdlib.Conn
	c *hungConnector
}

func (c hungConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	if c.c.armed.Load() && strings.Contains(q, "SET owner = ''") {
		c.c.held.Add(1)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.c.let:
		}
	}
	return c.Conn.QueryContext(ctx, q, args)
}

// TestReleaseOfLostLeaseWithDatabaseHung: a lease lost at its deadline (the
// database no longer answers, as in a partition, the usual reason a lease
// is lost) and then released by a deferred Release(context.Background())
// must return the loss promptly, as it did before Release sent the
// release statement for a lost lease too, not hang for as long as the
// database does.
func TestReleaseOfLostLeaseWithDatabaseHung(t *testing.T) {
	const name = "release-lost-hung"
	d := newDatabase(t, pg)
	hung := &hungConnector{let: make(chan struct{})}
	cfg, err := pgx.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	hung.Connector = stdlib.GetConnector(*cfg)
	db := sql.OpenDB(hung)
	t.Cleanup(func() { _ = db.Close() })
	var once atomic.Bool
	letGo := func() {
		if once.CompareAndSwap(false, true) {
			close(hung.let)
		}
	}
	t.Cleanup(letGo)
	l := d.locker(t, db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	hung.armed.Store(true)
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	released := make(chan error, 1)
	go func() { released <- lease.Release(context.Background()) }()
	select {
	case err := <-released:
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release of the lost lease = %v, want ErrLeaseLost", err)
		}
	case <-time.After(5 * time.Second):
		letGo()
		<-released
		t.Fatalf("Release of the lost lease still running 5 s in, with the database hung (%d statements held)", hung.held.Load())
	}
}
