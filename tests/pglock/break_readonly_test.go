package pglock_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// A database that turns read-only under a holder (a primary demoted to a
// standby, default_transaction_read_only set by an operator): Acquire
// fails by its budget with the server's reason (SQLSTATE 25006), the
// holder's watchdog cannot renew and its lease ends by its deadline
// (Done closes, Err matches ErrLeaseLost), and Release returns an error
// within its ctx rather than hang.
func TestDatabaseTurnsReadOnly(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "ro") // watchdog lease of watchdogTTL
	if err != nil {
		t.Fatal(err)
	}
	admin := open(t, pg.DSN("postgres"), nil)
	for _, q := range []string{
		`ALTER DATABASE ` + d.name + ` SET default_transaction_read_only = on`,
		// Sessions take the setting when they start: end the pool's.
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '` + d.name + `'`,
	} {
		if _, err := admin.ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-lease.Done():
	case <-time.After(10 * watchdogTTL):
		t.Fatalf("the lease on a read-only database is still held after %v (Err %v)", 10*watchdogTTL, lease.Err())
	}
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", lease.Err())
	}
	for _, wait := range []time.Duration{0, 500 * time.Millisecond} {
		start := time.Now()
		_, err := l.Acquire(ctxFor(t, 10*time.Second), "other", fence.TTL(time.Minute), fence.Wait(wait))
		took := time.Since(start)
		if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "25006") {
			t.Fatalf("Acquire(wait %v) on a read-only database = %v, want ErrNotAcquired with the server's reason", wait, err)
		}
		if took > wait+time.Second {
			t.Fatalf("Acquire(wait %v) on a read-only database took %v", wait, took)
		}
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if err := lease.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of the lost lease = %v, want ErrLeaseLost", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Release took %v", took)
	}
}

// The longest TTL a Duration holds: the database's expiry, the holder's
// Deadline, a waiter's computed wait and Extend neither overflow nor fail;
// the waiter wakes on the release.
func TestLongestTTL(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	huge := time.Duration(math.MaxInt64)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "huge", fence.TTL(huge))
	if err != nil {
		t.Fatal(err)
	}
	if dl := lease.Deadline(); dl.Before(time.Now().Add(100 * 365 * 24 * time.Hour)) {
		t.Fatalf("Deadline %v for a TTL of %v", dl, huge)
	}
	if err := lease.Extend(ctxFor(t, 10*time.Second), huge); err != nil {
		t.Fatalf("Extend(%v) = %v", huge, err)
	}
	if _, err := l.Acquire(ctxFor(t, 10*time.Second), "huge", fence.Wait(200*time.Millisecond)); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("second Acquire = %v, want ErrHeld", err)
	}
	got := make(chan error, 1)
	go func() {
		other, err := l.Acquire(ctxFor(t, 10*time.Second), "huge", fence.TTL(huge), fence.Wait(5*time.Second))
		if err == nil {
			if other.Token() <= lease.Token() {
				err = errors.New("token did not grow")
			}
			_ = other.Release(context.Background())
		}
		got <- err
	}()
	// The waiter listens once its first try found the lock held.
	waitUntil(t, func() bool {
		var n int
		err := d.db.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&n)
		return err == nil && n > 0
	})
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter on a lease of the longest TTL: %v", err)
	}
}
