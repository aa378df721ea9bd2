package pglock_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
)

// An Acquire cancelled (context.Canceled: no deadline) after its try was
// sent, and before its answer came, returns an error; the try may still
// take the row on the server (it was blocked on a row lock, or in the
// socket of a stalled backend). The give-up must treat the cancellation as
// "may have been sent", as redislock now does (643eead), and give the row
// back: once the try is unblocked, the lock is free well before the lease
// time (a minute) of the abandoned try.
func TestCancelledTryGivenBack(t *testing.T) {
	t.Run("blockedOnRowLock", func(t *testing.T) { testCancelledBlockedTry(t, false, false) })
	t.Run("blockedOnRowLockCancelRequest", func(t *testing.T) { testCancelledBlockedTry(t, false, true) })
	t.Run("blockedWhileWaiting", func(t *testing.T) { testCancelledBlockedTry(t, true, false) })
	t.Run("stalledBackend", testCancelledStalledTry)
}

// testCancelledBlockedTry cancels an Acquire whose try is blocked on the
// row's lock, held by a transaction elsewhere, over a free row. waiting:
// the try is one of a Wait budget's later ones, made at the expiry of a
// holder; otherwise the Acquire's first. cancelRequest: pgx sends a
// CancelRequest when ctx ends and waits for the server's answer (the
// connection stays open), instead of closing the connection (its default).
func testCancelledBlockedTry(t *testing.T, waiting, cancelRequest bool) {
	const name = "cancelled-blocked-try"
	d := newDatabase(t, pg)
	db := d.db
	if cancelRequest {
		cfg, err := pgx.ParseConfig(d.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
		}
		db = sql.OpenDB(stdlib.GetConnector(*cfg))
		t.Cleanup(func() { _ = db.Close() })
	}
	l := d.locker(t, db)
	var opts []fence.Option
	if waiting {
		// A holder whose lease expires soon: the waiter's try at its
		// expiry finds the row expired, and blocks on the row lock.
		if _, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(400*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		opts = append(opts, fence.Wait(time.Minute))
	} else {
		// The row exists, free: the try is the UPDATE that takes it.
		makeRow(t, l, name)
	}
	tx, err := d.db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(t.Context(), `SELECT 1 FROM fence_leases WHERE name = $1 FOR UPDATE`, name); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, append(opts, fence.TTL(time.Minute))...)
		if lease != nil {
			_ = lease.Release(context.Background())
		}
		done <- err
	}()
	// The try is in the server, waiting for the row's lock.
	blocked := pollFor(4*time.Second, func() bool {
		var n int
		err := d.db.QueryRowContext(ctxFor(t, 5*time.Second), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%nextval%'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if !blocked {
		t.Fatal("the try never blocked on the row lock")
	}
	cancel()
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled Acquire has not returned 5 s on")
	}
	if err == nil {
		t.Fatal("an Acquire cancelled while its try was blocked succeeded")
	}
	if !cancelRequest && !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Acquire = %v, want context.Canceled", err)
	}
	t.Logf("Acquire: %v", err)
	// Unblock: the abandoned try, if it still runs, takes the free row
	// now, for a minute.
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	assertFreeSoon(t, d, name)
}

// testCancelledStalledTry cancels an Acquire whose try was written to the
// socket of a stopped backend (SIGSTOP), which reads it once it resumes.
func testCancelledStalledTry(t *testing.T) {
	const name = "cancelled-stalled-try"
	d := newDatabase(t, pg)
	cfg, err := pgx.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan struct{})
	var once sync.Once
	var armed atomic.Bool
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeSeen{c, []byte(name), &armed, &once, seen}, nil
	}
	db := sql.OpenDB(stdlib.GetConnector(*cfg))
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1) // the try goes to the backend whose PID we read
	l := d.locker(t, db)
	makeRow(t, l, name)
	pid := backendPID(t, db)
	resume := stopBackend(t, pid)
	armed.Store(true)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
		if lease != nil {
			_ = lease.Release(context.Background())
		}
		done <- err
	}()
	select {
	case <-seen:
	case <-time.After(5 * time.Second):
		t.Fatal("the try was never written")
	}
	cancel()
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled Acquire has not returned 5 s on")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire cancelled on a stalled backend = %v, want context.Canceled", err)
	}
	// Let the stalled backend go on once the give-up waits for it to go,
	// or at once if it never does: either way it may read the try now.
	waiting := pollFor(3*time.Second, func() bool { return terminating(t, d) })
	t.Logf("give-up waiting for the stalled backend: %v", waiting)
	resume()
	assertFreeSoon(t, d, name)
}

// writeSeen is a connection that closes seen once a write carrying mark
// has gone out while armed.
type writeSeen struct {
	net.Conn
	mark  []byte
	armed *atomic.Bool
	once  *sync.Once
	seen  chan struct{}
}

func (w writeSeen) Write(b []byte) (int, error) {
	n, err := w.Conn.Write(b)
	if err == nil && w.armed.Load() && bytes.Contains(b, w.mark) {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
}

// assertFreeSoon fails unless another Locker takes name within a few
// seconds: the abandoned try's lease would hold it for a minute.
func assertFreeSoon(t *testing.T, d database, name string) {
	t.Helper()
	lease, err := d.locker(t, d.db).Acquire(ctxFor(t, 10*time.Second), name,
		fence.TTL(time.Minute), fence.Wait(3500*time.Millisecond))
	if err != nil {
		var owner string
		var left sql.NullFloat64
		_ = d.db.QueryRowContext(ctxFor(t, 5*time.Second),
			`SELECT owner, extract(epoch FROM expires_at - clock_timestamp()) FROM fence_leases WHERE name = $1`,
			name).Scan(&owner, &left)
		t.Fatalf("the lock is held after the cancelled Acquire (owner %q, %.1f s left): %v", owner, left.Float64, err)
	}
	_ = lease.Release(ctxFor(t, 10*time.Second))
}
