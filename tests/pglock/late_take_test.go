package pglock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// holdRelease is a driver.Connector whose connections, once armed, hold
// the next release statement (pglock's "SET owner = ”") until let go:
// reached is closed when it is held.
type holdRelease struct {
	driver.Connector
	mu      sync.Mutex
	armed   bool
	reached chan struct{}
	letGo   chan struct{}
}

func (h *holdRelease) arm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.reached, h.letGo = true, make(chan struct{}), make(chan struct{})
}

func (h *holdRelease) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := h.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return holdConn{conn.(*stdlib.Conn), h}, nil
}

type holdConn struct {
	*stdlib.Conn
	h *holdRelease
}

func (c holdConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.h.mu.Lock()
	hold := c.h.armed && strings.Contains(q, "SET owner = ''")
	if hold {
		c.h.armed = false
		close(c.h.reached)
	}
	c.h.mu.Unlock()
	if hold {
		<-c.h.letGo
	}
	return c.Conn.ExecContext(ctx, q, args)
}

// An Acquire whose try sits in the socket of a stalled backend (SIGSTOP:
// a server paging, a VM paused) for longer than the lease time, then takes
// the free row. Acquire returned a lease whose deadline, counted from the
// try's send, had passed: "lease lost: its lease time ran out" at once,
// while the row stayed the lease's owner's for the lease time counted by
// the database. It now gives the row back and returns ErrNotAcquired
// saying the reply came too late (try once), or tries again as a new owner
// within its wait budget.
func TestLateTake(t *testing.T) {
	t.Run("once", func(t *testing.T) { testLateTake(t, 0) })
	t.Run("wait", func(t *testing.T) { testLateTake(t, 10*time.Second) })
}

func testLateTake(t *testing.T, wait time.Duration) {
	const name, ttl = "late-take", time.Second
	d := newDatabase(t, pg)
	cfg, err := pgx.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	hold := &holdRelease{Connector: stdlib.GetConnector(*cfg)}
	db := sql.OpenDB(hold)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1) // the try goes to the backend whose PID we read
	l := d.locker(t, db)
	// The row exists, free: the try is the UPDATE that takes it.
	makeRow(t, l, name)
	resume := stopBackend(t, backendPID(t, db))
	type result struct {
		lease fence.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		ls, err := l.Acquire(ctxFor(t, 30*time.Second), name, fence.TTL(ttl), fence.Wait(wait))
		got <- result{ls, err}
	}()
	// Twice the lease time from now, which is after the try was sent:
	// a lease of a clock of its own running out.
	probe, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := probe.Acquire(ctxFor(t, time.Second), "probe", fence.TTL(2*ttl))
	if err != nil {
		t.Fatal(err)
	}
	<-pl.Done()
	if wait == 0 {
		// The give-back is held on its way: Acquire returns only once
		// it is answered, so that a caller trying again at once finds
		// the row free.
		hold.arm()
		var letGo sync.Once
		release := func() { letGo.Do(func() { close(hold.letGo) }) }
		t.Cleanup(release) // on a failure below too
		resume()
		select {
		case <-hold.reached:
		case <-time.After(20 * time.Second):
			t.Fatal("no give-back 20 s after the backend resumed")
		}
		select {
		case r := <-got:
			t.Fatalf("Acquire returned before its give-back was answered: %v, lease %v", r.err, r.lease)
		case <-time.After(200 * time.Millisecond):
		}
		release()
	}
	resume()
	var r result
	var returned time.Time
	select {
	case r = <-got:
		returned = time.Now()
	case <-time.After(20 * time.Second):
		t.Fatal("Acquire has not returned 20 s after the backend resumed")
	}
	if r.lease != nil {
		defer r.lease.Release(context.Background()) //nolint:errcheck // the test's verdict is on Err
	}
	if wait == 0 {
		if r.lease != nil {
			t.Fatalf("Acquire whose reply came %v past its deadline returned a lease, Err = %v", time.Since(r.lease.Deadline()).Round(time.Millisecond), r.lease.Err())
		}
		if !errors.Is(r.err, fence.ErrNotAcquired) || !errors.Is(r.err, fence.ErrLeaseLost) || !strings.Contains(r.err.Error(), "too late") {
			t.Fatalf("Acquire = %v, want ErrNotAcquired saying the reply came too late", r.err)
		}
		t.Logf("Acquire: %v", r.err)
		// Given back before Acquire returned: a try-once Acquire right
		// after it gets the row, which the late take held for its lease
		// time by the database's clock.
		other, err := d.locker(t, open(t, d.dsn, nil)).Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("%v after the late take's Acquire returned: %v", time.Since(returned).Round(time.Millisecond), err)
		}
		_ = other.Release(ctxFor(t, 10*time.Second))
		return
	}
	if r.err != nil {
		t.Fatalf("Acquire with %v to wait after a late take: %v", wait, r.err)
	}
	if err := r.lease.Err(); err != nil {
		t.Fatalf("Acquire returned a lease already ended: %v", err)
	}
}
