package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/pglock"
)

func TestConformance(t *testing.T) {
	d := newDatabase(t, pg)
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New:               func(t testing.TB) fence.Locker { return d.locker(t, d.db) },
		Remove:            d.remove,
		NewObserved: func(t testing.TB, obs fence.Observer) fence.Locker {
			return d.lockerWith(t, d.db, pglock.Options{Observer: obs})
		},
		NewLogged: func(t testing.TB, log *slog.Logger) fence.Locker {
			return d.lockerWith(t, d.db, pglock.Options{Logger: log})
		},
		NewClosable: func(t testing.TB) (fence.Locker, func()) {
			db := open(t, d.dsn, nil)
			return d.lockerWith(t, db, pglock.Options{}), func() { _ = db.Close() }
		},
		WatchdogTTL: watchdogTTL,
	})
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// The tokens come from a sequence, which survives a crash of the server:
// after an immediate shutdown and a restart on the same data directory,
// the next token is greater than every token issued before.
func TestTokensIncreaseAcrossRestart(t *testing.T) {
	srv, err := pgtest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	d := newDatabase(t, srv)
	// The test server runs with synchronous_commit=off, under which a
	// crash loses the last commits, the sequence's advance among them:
	// pglock needs it on (PostgreSQL's default).
	if _, err := d.db.ExecContext(t.Context(), `ALTER DATABASE `+d.name+` SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	_ = d.db.Close()
	d.db = open(t, d.dsn, nil)
	l := d.locker(t, d.db)
	var last fence.Token
	for range 5 {
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), "restart", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		last = lease.Token()
		if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// The pool's connections died with the server: the first tries may
	// fail; a Wait budget retries them.
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "restart", fence.TTL(time.Minute), fence.Wait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	if lease.Token() <= last {
		t.Fatalf("token after restart %d, want > %d", lease.Token(), last)
	}
	t.Logf("last token before the restart %d, first after %d", last, lease.Token())
}

// A waiter sends no statement while the holder's lease lives: it wakes on
// the release's notification.
func TestWaiterSendsNoQueriesWhileHeld(t *testing.T) {
	d := newDatabase(t, pg)
	holder := d.locker(t, d.db)
	var count atomic.Int64
	waiterDB := open(t, d.dsn, &count)
	waiter := d.locker(t, waiterDB)

	lease, err := holder.Acquire(ctxFor(t, 10*time.Second), "quiet", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan fence.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(ctxFor(t, 30*time.Second), "quiet", fence.Wait(20*time.Second))
		errc <- err
		got <- l
	}()
	// Wait until the waiter has tried (insert, then the holder's time
	// left), listened, and tried again, and then hold for a while.
	const tries = 4
	deadline := time.Now().Add(5 * time.Second)
	for count.Load() < tries {
		if time.Now().After(deadline) {
			t.Fatalf("the waiter sent %d statements in 5s", count.Load())
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
	hold := time.NewTimer(1500 * time.Millisecond) // no event to wait on: a statement not sent has none; the waiter is watched for 1.5 s
	<-hold.C
	during := count.Load()
	released := time.Now()
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	l := <-got
	defer l.Release(context.Background())
	t.Logf("waiter: %d statements while held 1.5s, %d in all; acquired %v after the release", during, count.Load(), time.Since(released))
	if during != tries {
		t.Fatalf("the waiter sent %d statements while the lock was held, want %d (its tries before and after LISTEN)", during, tries)
	}
	if l.Token() <= lease.Token() {
		t.Fatalf("token %d after %d", l.Token(), lease.Token())
	}
}

// A holder whose process died (its connections closed, no more renewals)
// is taken over after its lease expires by the database's clock.
func TestKilledHolderTakenOver(t *testing.T) {
	d := newDatabase(t, pg)
	holderDB := open(t, d.dsn, nil)
	holder := d.locker(t, holderDB)
	lease, err := holder.Acquire(ctxFor(t, 10*time.Second), "killed")
	if err != nil {
		t.Fatal(err)
	}
	// The "process" dies: its pool is closed; the watchdog can no longer
	// renew.
	_ = holderDB.Close()
	killed := time.Now()
	waiter := d.locker(t, d.db)
	l, err := waiter.Acquire(ctxFor(t, 10*time.Second), "killed", fence.Wait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	took := time.Since(killed)
	t.Logf("taken over %v after the holder died (watchdog TTL %v)", took, watchdogTTL)
	if took > watchdogTTL+4*time.Second { // slack for a loaded machine, under the waiter's 5 s
		t.Fatalf("taken over after %v, want within the lease time %v and slack", took, watchdogTTL)
	}
	select {
	case <-lease.Done():
	case <-time.After(watchdogTTL + time.Second):
		t.Fatal("the dead holder's lease did not end at its deadline")
	}
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("dead holder's Err = %v", lease.Err())
	}
}

// With the server down, Acquire (with and without a wait), Extend and
// Release return errors within the caller's deadline.
func TestServerDown(t *testing.T) {
	srv, err := pgtest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	d := newDatabase(t, srv)
	l := d.locker(t, d.db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "down", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	const budget = 500 * time.Millisecond
	for _, c := range []struct {
		what string
		call func(ctx context.Context) error
	}{
		{"Acquire", func(ctx context.Context) error { _, err := l.Acquire(ctx, "other"); return err }},
		{"Acquire with Wait", func(ctx context.Context) error {
			_, err := l.Acquire(ctx, "other", fence.Wait(time.Minute))
			return err
		}},
		{"Extend", func(ctx context.Context) error { return lease.Extend(ctx, time.Minute) }},
		{"Release", func(ctx context.Context) error { return lease.Release(ctx) }},
	} {
		start := time.Now()
		err := c.call(ctxFor(t, budget))
		took := time.Since(start)
		t.Logf("%s: %v after %v", c.what, err, took)
		if err == nil {
			t.Errorf("%s succeeded with the server down", c.what)
		}
		if took > budget+200*time.Millisecond {
			t.Errorf("%s took %v, budget %v", c.what, took, budget)
		}
	}
}

func TestInvalidTable(t *testing.T) {
	for _, table := range []string{"Leases", "1x", "a-b", "a.b", "x\"; DROP TABLE y; --", string(make([]byte, 60))} {
		_, err := pglock.New(pg.NewDB(t), &pglock.Options{Table: table})
		var ite *pglock.InvalidTableError
		if !errors.As(err, &ite) || !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("New(table %q) = %v, want *InvalidTableError matching ErrInvalidOption", table, err)
		}
	}
}

// Without a Listener, a waiter wakes at the holder's expiry as the
// database computes it: a release goes unnoticed until then, and the
// waiter sends nothing in between.
func TestWaiterWithoutListenerWakesAtExpiry(t *testing.T) {
	d := newDatabase(t, pg)
	holder := d.locker(t, d.db)
	var count atomic.Int64
	waiter, err := pglock.New(open(t, d.dsn, &count), nil)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second
	lease, err := holder.Acquire(ctxFor(t, 10*time.Second), "nolisten", fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	go func() {
		// Release once the waiter is waiting (it has tried and read
		// the time left).
		for deadline := time.Now().Add(5 * time.Second); count.Load() < 2 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond) // polling with a deadline
		}
		_ = lease.Release(context.Background())
	}()
	l, err := waiter.Acquire(ctxFor(t, 10*time.Second), "nolisten", fence.Wait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	took := time.Since(granted)
	t.Logf("acquired %v after the grant of a %v lease released early; %d statements", took, ttl, count.Load())
	if took < ttl-100*time.Millisecond || took > ttl+time.Second {
		t.Fatalf("acquired after %v, want at the holder's expiry %v", took, ttl)
	}
	if n := count.Load(); n != 3 {
		t.Fatalf("%d statements, want 3 (try, time left, try at expiry)", n)
	}
}

// countingListener counts Listen calls and remembers the backend pids of
// its connections, so a test can kill them.
type countingListener struct {
	pgxListener
	calls atomic.Int64
}

func (c *countingListener) Listen(ctx context.Context, channel string) (<-chan string, error) {
	c.calls.Add(1)
	return c.pgxListener.Listen(ctx, channel)
}

// The waiters of one Locker share one LISTEN connection, whatever their
// lock names; when that connection is killed mid-wait, they listen again
// and still wake on the release, long before the holder's expiry.
func TestWaitersShareOneListenAndSurviveItsLoss(t *testing.T) {
	d := newDatabase(t, pg)
	holder := d.locker(t, d.db)
	ln := &countingListener{pgxListener: pgxListener{d.dsn + "&application_name=pglock_listener"}}
	var statements atomic.Int64
	waiter, err := pglock.New(open(t, d.dsn, &statements), &pglock.Options{Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 4
	// settled waits until each waiter has made n statements in all:
	// after a (re)join, a waiter tries again (2 statements) and then waits.
	settled := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); statements.Load() < n*waiters; time.Sleep(5 * time.Millisecond) { // polling with a deadline
			if time.Now().After(deadline) {
				t.Fatalf("waiters made %d statements, want %d", statements.Load(), n*waiters)
			}
		}
	}
	var leases []fence.Lease
	for i := range waiters {
		lease, err := holder.Acquire(ctxFor(t, 10*time.Second), fmt.Sprint("share", i), fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	errc := make(chan error, waiters)
	for i := range waiters {
		go func() {
			l, err := waiter.Acquire(ctxFor(t, 30*time.Second), fmt.Sprint("share", i), fence.Wait(20*time.Second))
			if err == nil {
				err = l.Release(context.Background())
			}
			errc <- err
		}()
	}
	listening := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) { // polling with a deadline
			var got int
			err := d.db.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pglock_listener' AND query LIKE 'LISTEN%'`).Scan(&got)
			if err != nil {
				t.Fatal(err)
			}
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d listening connections, want %d", got, n)
			}
		}
	}
	settled(4) // try, listen, try
	listening(1)
	if c := ln.calls.Load(); c != 1 {
		t.Fatalf("%d Listen calls for %d waiters, want 1", c, waiters)
	}
	// Kill the listening connection: the waiters listen again.
	if _, err := d.db.ExecContext(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pglock_listener'`); err != nil {
		t.Fatal(err)
	}
	settled(6) // and listen again, try
	listening(1)
	released := time.Now()
	for _, lease := range leases {
		if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	for range waiters {
		if err := <-errc; err != nil {
			t.Fatalf("waiter: %v", err)
		}
	}
	t.Logf("%d waiters acquired %v after the releases; %d Listen calls", waiters, time.Since(released), ln.calls.Load())
	// Once the old subscription is gone, the first waiter back listens
	// again and the others share it; a waiter that comes back after the
	// others were granted and left listens anew.
	if c := ln.calls.Load(); c < 2 || c > 1+waiters {
		t.Fatalf("%d Listen calls, want one and then 1 to %d after the kill", c, waiters)
	}
	if took := time.Since(released); took > 5*time.Second {
		t.Fatalf("waiters acquired %v after the release", took)
	}
}

// A table named with a reserved word works: pglock quotes its names.
func TestReservedWordTable(t *testing.T) {
	db := pg.NewDB(t)
	l, err := pglock.New(db, &pglock.Options{Table: "order"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.EnsureSchema(t.Context()); err != nil {
		t.Fatal(err)
	}
	var last fence.Token
	for range 2 {
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if lease.Token() <= last {
			t.Fatalf("token %d, want > %d", lease.Token(), last)
		}
		last = lease.Token()
		if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEnsureSchemaConcurrently: processes that start together each call
// EnsureSchema on a fresh database. PostgreSQL's CREATE ... IF NOT EXISTS
// is not safe against a concurrent one (the loser fails with a unique
// violation in the catalog rather than finding the object): each call must
// succeed.
func TestEnsureSchemaConcurrently(t *testing.T) {
	for round := range 5 {
		db := pg.NewDB(t)
		db.SetMaxOpenConns(8)
		l, err := pglock.New(db, nil)
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		errs := make(chan error, 8)
		for range 8 {
			go func() {
				<-start
				errs <- l.EnsureSchema(t.Context())
			}()
		}
		close(start)
		for range 8 {
			if err := <-errs; err != nil {
				t.Errorf("round %d: EnsureSchema at once with 7 others: %v", round, err)
			}
		}
	}
}
