package pglock_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
)

// An Acquire whose try went into the socket of a backend that is stalled
// (here stopped with SIGSTOP: a server paging, a VM paused) fails by its
// ctx, and gives up. pgx then sends a CancelRequest, which the stalled
// backend will find as it resumes, idle, and ignore; the give-up's
// owner-checked clean-up runs on another connection, finds nothing to free,
// and the backend, once resumed, reads the try and commits it: the lock
// was held for its whole TTL (a minute) by the owner of an Acquire that had
// returned an error. The clean-up must make sure the abandoned statement
// can never run: the lock must be free once the backend has resumed and is
// gone, whether it resumed while the clean-up waited for it (resumeDuring)
// or only after the clean-up had given up waiting (resumeAfter).
func TestGivenUpTryOnStalledBackend(t *testing.T) {
	t.Run("resumeDuring", func(t *testing.T) { testStalledBackend(t, false, nil) })
	t.Run("resumeAfter", func(t *testing.T) { testStalledBackend(t, true, nil) })
}

// testStalledBackend runs the stalled backend's case; dsnOf, if not nil,
// gives the DSN the Locker connects with (another role, a Unix socket),
// d.dsn otherwise.
func testStalledBackend(t *testing.T, after bool, dsnOf func(t *testing.T, d database) string) {
	const name = "stalled-backend"
	d := newDatabase(t, pg)
	dsn := d.dsn
	if dsnOf != nil {
		dsn = dsnOf(t, d)
	}
	db := open(t, dsn, nil)
	db.SetMaxOpenConns(1) // the try goes to the backend whose PID we read
	l := d.locker(t, db)
	// The row exists, free: the try is the UPDATE that takes it.
	firstToken := makeRow(t, l, name)
	pid := backendPID(t, db)
	resume := stopBackend(t, pid)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := l.Acquire(ctx, name, fence.TTL(time.Minute)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on a stalled backend = %v, want its ctx's deadline", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Acquire with a 300 ms ctx on a stalled backend returned after %v", took)
	}

	// The clean-up, if it waits for the stalled backend to go, shows as a
	// session waiting for BackendTermination. Without that wait (the fix
	// missing) the clean-up has run by then, or never comes.
	seen := pollFor(3*time.Second, func() bool { return terminating(t, d) })
	t.Logf("clean-up waiting for the stalled backend: %v", seen)
	if after && seen {
		// Let the clean-up give up waiting (the backend stays stopped).
		if !pollFor(5*time.Second, func() bool { return !terminating(t, d) }) {
			t.Fatal("the clean-up still waits for the stalled backend 5 s on")
		}
	}
	resume()
	// The resumed backend runs what is in its socket, or dies: wait until
	// it is gone (the client closed its connection).
	gone := pollFor(10*time.Second, func() bool {
		var n int
		err := d.db.QueryRowContext(ctxFor(t, 5*time.Second),
			`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if !gone {
		t.Fatalf("backend %d still there 10 s after it resumed", pid)
	}
	var owner string
	var token int64
	var left sql.NullFloat64
	if err := d.db.QueryRowContext(ctxFor(t, 5*time.Second),
		`SELECT owner, token, extract(epoch FROM expires_at - clock_timestamp()) FROM fence_leases WHERE name = $1`,
		name).Scan(&owner, &token, &left); err != nil {
		t.Fatal(err)
	}
	// The free that follows the wait may have undone the try, had it
	// run: its token would show it.
	if token != int64(firstToken) {
		t.Errorf("the abandoned try ran: the row's token is %d, owner %q, %.1f s left; the last lease's token was %d",
			token, owner, left.Float64, firstToken)
	}
	lease, err := d.locker(t, d.db).Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("the lock is held after the Acquire that gave up (owner %q, %.1f s left): %v", owner, left.Float64, err)
	}
	_ = lease.Release(ctxFor(t, 10*time.Second))
}

// terminating reports whether a session of d's server waits for a backend
// to terminate (pg_terminate_backend with a timeout): a give-up waiting for
// a stalled backend to go.
func terminating(t *testing.T, d database) bool {
	var n int
	err := d.db.QueryRowContext(ctxFor(t, 5*time.Second),
		`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'BackendTermination'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// pollFor polls cond until it holds or d has passed, and reports whether
// it held.
func pollFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	return true
}

// A try that the server cancelled (pgx configured to send a CancelRequest
// when ctx ends, and to wait for the server's answer) ended with the
// server's error, and its connection goes back to the pool: the give-up
// must free the row without terminating that backend, which the pool
// keeps and will hand to someone else.
func TestGivenUpTryAnsweredKeepsBackend(t *testing.T) {
	const name = "answered-try"
	d := newDatabase(t, pg)
	cfg, err := pgx.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
	}
	db := sql.OpenDB(stdlib.GetConnector(*cfg))
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1) // the try, and then the clean-up, on the backend whose PID we read
	l := d.locker(t, db)
	makeRow(t, l, name)
	pid := backendPID(t, db)
	tx, err := d.db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(t.Context(), `SELECT 1 FROM fence_leases WHERE name = $1 FOR UPDATE`, name); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = l.Acquire(ctx, name, fence.TTL(time.Minute))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("Acquire blocked on a row lock, cancelled = %v, want the server's query_canceled", err)
	}
	// The clean-up's free runs on the pool's one connection: that
	// backend's last statement is then the free; had the clean-up
	// terminated it, it would be gone.
	var state, query string
	done := pollFor(5*time.Second, func() bool {
		err := d.db.QueryRowContext(ctxFor(t, 5*time.Second),
			`SELECT state, query FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&state, &query)
		if errors.Is(err, sql.ErrNoRows) {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
		return state == "idle" && strings.Contains(query, "SET owner = ''")
	})
	if !done {
		t.Fatalf("the clean-up did not run in 5 s: backend %d %s, last %q", pid, state, query)
	}
	var again int
	if err := db.QueryRowContext(ctxFor(t, 10*time.Second), `SELECT pg_backend_pid()`).Scan(&again); err != nil {
		t.Fatal(err)
	}
	if again != pid {
		t.Fatalf("the pool's backend %d, whose try had been answered, was replaced by %d", pid, again)
	}
}

// backendPID is the PID of the backend of db's one connection.
func backendPID(t *testing.T, db *sql.DB) int {
	t.Helper()
	var pid int
	if err := db.QueryRowContext(ctxFor(t, 10*time.Second), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// stopBackend stops the backend pid (SIGSTOP) until resume, or the test's
// end, lets it go on.
// poolOfOne opens a pool of one connection to d, each connection wrapped
// by wrap as it is dialled, and a Locker over it that has taken and
// released name once, so that the pool's connection is open. It returns
// them with that connection's backend PID and its client end as dialled,
// for the test to stall and cut.
func poolOfOne(t *testing.T, d database, name string, wrap func(net.Conn) net.Conn) (l *pglock.Locker, db *sql.DB, pid int, conn net.Conn) {
	t.Helper()
	cfg, err := pgx.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		return wrap(c), nil
	}
	db = sql.OpenDB(stdlib.GetConnector(*cfg))
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	l = d.locker(t, db)
	makeRow(t, l, name)
	pid = backendPID(t, db)
	mu.Lock()
	defer mu.Unlock()
	if len(conns) != 1 {
		t.Fatalf("%d connections, want 1", len(conns))
	}
	return l, db, pid, conns[0]
}

// makeRow takes the lock called name and releases it, so that its row
// exists, free: a later try is the UPDATE that takes it. It returns the
// token of that lease.
func makeRow(t *testing.T, l *pglock.Locker, name string) fence.Token {
	t.Helper()
	first, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	return first.Token()
}

// rowOwner returns the owner in the row of the lock called name ("" when
// the lock is free).
func rowOwner(t *testing.T, d database, name string) string {
	t.Helper()
	var owner string
	if err := d.db.QueryRowContext(ctxFor(t, 5*time.Second),
		`SELECT owner FROM fence_leases WHERE name = $1`, name).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	return owner
}

// waitRowFree waits up to within for the lock called name to be free, and
// returns the row's owner at the last look ("" once free).
func waitRowFree(t *testing.T, d database, name string, within time.Duration) (owner string) {
	t.Helper()
	pollFor(within, func() bool { owner = rowOwner(t, d, name); return owner == "" })
	return owner
}

// waitBackendGone waits, 10 s at most, until the backend pid, resumed, has
// gone from d's server.
func waitBackendGone(t *testing.T, d database, pid int) {
	t.Helper()
	gone := pollFor(10*time.Second, func() bool {
		var n int
		if err := d.db.QueryRowContext(ctxFor(t, 5*time.Second),
			`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if !gone {
		t.Fatalf("backend %d still there 10 s after it resumed", pid)
	}
}

func stopBackend(t *testing.T, pid int) (resume func()) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stop backend %d: %v", pid, err)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("resume backend %d: %v", pid, err)
			}
		})
	}
	t.Cleanup(resume)
	return resume
}
