package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/pglock"
)

// The server crashes and restarts while a waiter listens for a release:
// the waiter's LISTEN connection dies with it. It listens again once the
// server is back, so a release after the restart wakes it long before the
// holder's expiry (a minute away), with a greater token; and its Acquire
// ends by its budget whatever happens.
func TestWaiterAcrossRestart(t *testing.T) {
	srv, err := pgtest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	d := newDatabase(t, srv)
	// Restart is a crash and the test server runs with
	// synchronous_commit=off: make the holder's row durable.
	for _, q := range []string{`ALTER DATABASE ` + d.name + ` SET synchronous_commit = on`, `CHECKPOINT`} {
		if _, err := d.db.ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	_ = d.db.Close()
	d.db = open(t, d.dsn, nil)
	holder, err := d.locker(t, d.db).Acquire(ctxFor(t, 10*time.Second), "restart", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waiter := d.locker(t, open(t, d.dsn, nil))
	type result struct {
		lease fence.Lease
		err   error
		at    time.Time
	}
	got := make(chan result, 1)
	go func() {
		lease, err := waiter.Acquire(ctxFor(t, 30*time.Second), "restart", fence.TTL(time.Minute), fence.Wait(20*time.Second))
		got <- result{lease, err, time.Now()}
	}()
	listening := func() bool {
		var n int
		err := d.db.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&n)
		return err == nil && n > 0
	}
	waitUntil(t, listening)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, listening) // the waiter listens again
	released := time.Now()
	if err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Logf("first Release after the restart: %v", err)
		if err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatalf("second Release after the restart: %v", err)
		}
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("waiter across the restart: %v", r.err)
		}
		defer r.lease.Release(context.Background())
		if r.lease.Token() <= holder.Token() {
			t.Fatalf("token %d after %d", r.lease.Token(), holder.Token())
		}
		if took := r.at.Sub(released); took > 3*time.Second {
			t.Fatalf("the waiter took the lock %v after the release: it did not listen again", took)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("the waiter's Acquire with a 20 s budget has not returned after 25 s")
	}
}

// A watchdog lease across a server crash and restart shorter than its
// lease time: the renewals that fail while the server is down are retried,
// one succeeds once it is back (the row survived: synchronous_commit on),
// the lease is still held with its token, and its Release frees the lock.
func TestWatchdogLeaseAcrossRestart(t *testing.T) {
	srv, err := pgtest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	d := newDatabase(t, srv)
	for _, q := range []string{`ALTER DATABASE ` + d.name + ` SET synchronous_commit = on`, `CHECKPOINT`} {
		if _, err := d.db.ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	_ = d.db.Close()
	d.db = open(t, d.dsn, nil)
	l, err := pglock.New(d.db, &pglock.Options{WatchdogTTL: 6 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "watchdog")
	if err != nil {
		t.Fatal(err)
	}
	before := lease.Deadline()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// A renewal after the restart moves the deadline.
	end := time.Now().Add(15 * time.Second)
	for !lease.Deadline().After(before.Add(time.Second)) {
		if lease.Err() != nil {
			t.Fatalf("the lease ended across a restart shorter than its lease time: %v", lease.Err())
		}
		if time.Now().After(end) {
			t.Fatal("no renewal after the restart")
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	other, err := l.Acquire(ctxFor(t, 10*time.Second), "watchdog", fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("the lock released after the restart is still held: %v", err)
	}
	if other.Token() <= lease.Token() {
		t.Fatalf("token %d after %d", other.Token(), lease.Token())
	}
	_ = other.Release(context.Background())
}
