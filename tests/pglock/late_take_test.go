package pglock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

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
	db := open(t, d.dsn, nil)
	db.SetMaxOpenConns(1) // the try goes to the backend whose PID we read
	l := d.locker(t, db)
	// The row exists, free: the try is the UPDATE that takes it.
	first, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
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
		if !errors.Is(r.err, fence.ErrNotAcquired) || !strings.Contains(r.err.Error(), "too late") {
			t.Fatalf("Acquire = %v, want ErrNotAcquired saying the reply came too late", r.err)
		}
		t.Logf("Acquire: %v", r.err)
		// Given back: another Acquire gets the row well before the late
		// take's lease time (by the database's clock) would end.
		ol := d.locker(t, open(t, d.dsn, nil))
		var other fence.Lease
		if !pollFor(5*time.Second, func() bool {
			other, err = ol.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
			return err == nil
		}) {
			t.Fatalf("after the late take: %v", err)
		}
		_ = other.Release(ctxFor(t, 10*time.Second))
		if took := time.Since(returned); took > ttl/2 {
			t.Errorf("the late take's row was free %v after Acquire returned, want well under its lease time %v (given back)", took.Round(time.Millisecond), ttl)
		}
		return
	}
	if r.err != nil {
		t.Fatalf("Acquire with %v to wait after a late take: %v", wait, r.err)
	}
	if err := r.lease.Err(); err != nil {
		t.Fatalf("Acquire returned a lease already ended: %v", err)
	}
}
