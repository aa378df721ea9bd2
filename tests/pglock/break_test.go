package pglock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/internal/silent"
	"github.com/fencekit/fence/pglock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// Lock names are parameters, never spliced into SQL: quotes, SQL, unicode
// and names of the maximum length are locks like any other, and a waiter
// on each wakes on its release's notification (whose payload is the name).
func TestHostileNames(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	names := []string{
		`'; DROP TABLE fence_leases; --`,
		`"fence_leases"`,
		`a\'b\\`,
		`$1`,
		"ключ 🔒 鍵",
		strings.Repeat("é", fence.MaxNameLen/2),
		strings.Repeat("'", fence.MaxNameLen),
	}
	for _, name := range names {
		holder, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("Acquire(%.20q): %v", name, err)
		}
		got := make(chan error, 1)
		start := time.Now()
		go func() {
			lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute), fence.Wait(5*time.Second))
			if err == nil {
				if lease.Token() <= holder.Token() {
					err = fmt.Errorf("token %d after %d", lease.Token(), holder.Token())
				}
				_ = lease.Release(context.Background())
			}
			got <- err
		}()
		if err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatalf("Release(%.20q): %v", name, err)
		}
		if err := <-got; err != nil {
			t.Fatalf("waiter on %.20q: %v", name, err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("waiter on %.20q woke after %v: the notification did not reach it", name, took)
		}
	}
	var n int
	if err := d.db.QueryRowContext(t.Context(), `SELECT count(*) FROM fence_leases`).Scan(&n); err != nil || n != len(names) {
		t.Fatalf("%d rows (%v), want %d", n, err, len(names))
	}
}

// Many candidates on two connection pools, each pool limited to two
// connections, fight over one name: the tokens, read inside each holder's
// critical section, increase in the order of the grants.
func TestTokenOrderUnderContention(t *testing.T) {
	d := newDatabase(t, pg)
	var lockers []*pglock.Locker
	for range 2 {
		db := open(t, d.dsn, nil)
		db.SetMaxOpenConns(2)
		lockers = append(lockers, d.locker(t, db))
	}
	var (
		mu     sync.Mutex
		tokens []fence.Token
		inside int
	)
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for i := range 8 {
		l := lockers[i%2]
		wg.Go(func() {
			for range 15 {
				lease, err := l.Acquire(ctxFor(t, 30*time.Second), "contended", fence.TTL(10*time.Second), fence.Wait(20*time.Second))
				if err != nil {
					errc <- err
					return
				}
				mu.Lock()
				inside++
				if inside > 1 {
					errc <- errors.New("two holders at once")
				}
				tokens = append(tokens, lease.Token())
				mu.Unlock()
				mu.Lock()
				inside--
				mu.Unlock()
				if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d got token %d after %d", i, tokens[i], tokens[i-1])
		}
	}
	if len(tokens) != 8*15 {
		t.Fatalf("%d grants", len(tokens))
	}
}

// With one connection in the pool, a holder's watchdog and several waiters
// (listening on connections of their own) share it: nobody deadlocks, and
// the holder keeps its lease while they wait.
func TestOneConnectionPool(t *testing.T) {
	d := newDatabase(t, pg)
	db := open(t, d.dsn, nil)
	db.SetMaxOpenConns(1)
	l := d.locker(t, db)
	holder, err := l.Acquire(ctxFor(t, 10*time.Second), "one")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			lease, err := l.Acquire(ctxFor(t, 20*time.Second), "one", fence.Wait(15*time.Second))
			if err == nil {
				err = lease.Release(ctxFor(t, 10*time.Second))
			}
			errc <- err
		})
	}
	// The watchdog renews the holder's lease while they wait: wait until
	// it has moved the deadline two lease times past the one Acquire set,
	// past the waiters' tries again at the holder's deadline they were
	// told (each renewal moves it by a third of a lease time).
	granted := holder.Deadline()
	want := granted.Add(2 * watchdogTTL)
	tick := time.NewTicker(5 * time.Millisecond) // polling with a deadline
	defer tick.Stop()
	limit := time.NewTimer(10 * time.Second)
	defer limit.Stop()
	for !holder.Deadline().After(want) {
		select {
		case <-holder.Done():
			t.Fatalf("the holder lost its lease while the waiters shared its pool: %v", holder.Err())
		case <-limit.C:
			t.Fatalf("the watchdog moved the holder's deadline from %v to only %v in 10 s, want past %v",
				granted.Format(time.StampMilli), holder.Deadline().Format(time.StampMilli), want.Format(time.StampMilli))
		case <-tick.C:
		}
	}
	if err := holder.Err(); err != nil {
		t.Fatalf("the holder lost its lease while the waiters shared its pool: %v", err)
	}
	if err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// When the token sequence reaches its maximum, Acquire fails with an error
// that says so, at once even with a Wait budget, and never issues a token
// again (NO CYCLE).
func TestTokensExhausted(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	if _, err := d.db.ExecContext(t.Context(), `ALTER SEQUENCE fence_leases_token RESTART WITH 9223372036854775806`); err != nil {
		t.Fatal(err)
	}
	var last fence.Token
	for range 2 {
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), "max", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		last = lease.Token()
		if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if last != 1<<63-1 {
		t.Fatalf("last token %d", last)
	}
	start := time.Now()
	_, err := l.Acquire(ctxFor(t, 20*time.Second), "max", fence.TTL(time.Minute), fence.Wait(10*time.Second))
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, pglock.ErrTokensExhausted) {
		t.Fatalf("Acquire after the last token = %v, want ErrNotAcquired and pglock.ErrTokensExhausted", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Acquire took %v to report exhausted tokens: it retried a permanent error", took)
	}
}

// hangingListener never confirms its LISTEN and ignores ctx, as a broken
// driver might, until the test ends.
type hangingListener struct{ release chan struct{} }

func (h hangingListener) Listen(ctx context.Context, channel string) (<-chan string, error) {
	<-h.release
	return nil, errors.New("never listened")
}

// A Listener that never confirms (and ignores its ctx) does not hold Acquire
// beyond its Wait budget.
func TestListenerNeverConfirms(t *testing.T) {
	d := newDatabase(t, pg)
	h := hangingListener{make(chan struct{})}
	t.Cleanup(func() { close(h.release) })
	l, err := pglock.New(d.db, &pglock.Options{WatchdogTTL: watchdogTTL, Listener: h})
	if err != nil {
		t.Fatal(err)
	}
	holder, err := l.Acquire(ctxFor(t, 10*time.Second), "deaf", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctxFor(t, 30*time.Second), "deaf", fence.Wait(time.Second))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("Acquire = %v", err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("Acquire with a 1 s budget returned after %v", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire with a 1 s budget still waiting after 5 s on a Listener that never confirms")
	}
}

// A holder whose pool's connections died with a server restart can still
// release: its first Release may fail (the statement went out on a dead
// connection, and whether it ran is unknown to the driver), a second one
// frees the lock; fence.Run, which cannot hand the lease back for a retry,
// retries itself, so the lock is free at once when Run returns, not a lease
// time later.
func TestReleaseAfterRestart(t *testing.T) {
	srv, err := pgtest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	d := newDatabase(t, srv)
	// The test server runs with synchronous_commit=off, and Restart is a
	// crash: make the schema and the commits durable (see
	// TestTokensIncreaseAcrossRestart).
	for _, q := range []string{`ALTER DATABASE ` + d.name + ` SET synchronous_commit = on`, `CHECKPOINT`} {
		if _, err := d.db.ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	_ = d.db.Close()
	d.db = open(t, d.dsn, nil)
	l := d.locker(t, d.db)
	free := func() {
		t.Helper()
		other, err := d.locker(t, open(t, d.dsn, nil)).Acquire(ctxFor(t, 10*time.Second), "restart", fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("the lock released after the restart is still held: %v", err)
		}
		_ = other.Release(context.Background())
	}

	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "restart", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Logf("first Release after a restart: %v", err)
		if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatalf("second Release after a restart: %v", err)
		}
	}
	free()

	err = fence.Run(ctxFor(t, 10*time.Second), l, "restart", func(context.Context, fence.Lease) error {
		return srv.Restart()
	}, fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Run across a restart = %v", err)
	}
	free()
}

// An Acquire whose ctx ends while its statement waits for a row lock (a
// transaction elsewhere holds the row) returns by the deadline and leaves
// no lock behind: once that transaction ends, the lock is free.
func TestCancelWhileBlockedOnRowLock(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "rowlock", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	tx, err := d.db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(t.Context(), `SELECT 1 FROM fence_leases WHERE name = 'rowlock' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if _, err := l.Acquire(ctx, "rowlock", fence.TTL(time.Minute), fence.Wait(time.Minute)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire blocked on a row lock = %v, want the deadline", err)
	}
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Fatalf("Acquire with a 500 ms ctx returned after %v", took)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	other, err := l.Acquire(ctxFor(t, 10*time.Second), "rowlock", fence.TTL(time.Minute), fence.Wait(3*time.Second))
	if err != nil {
		t.Fatalf("after the cancelled Acquire the lock is not free: %v", err)
	}
	_ = other.Release(context.Background())
}

// A holder whose row is changed behind its back (an operator expires it, or
// rewrites its owner) learns that its lease is lost by its next renewal,
// within the watchdog TTL; the next holder's token is greater.
func TestRowChangedBehindHoldersBack(t *testing.T) {
	d := newDatabase(t, pg)
	for _, change := range []string{
		`UPDATE fence_leases SET expires_at = '-infinity' WHERE name = 'behind'`,
		`UPDATE fence_leases SET owner = 'someone else' WHERE name = 'behind'`,
		`DELETE FROM fence_leases WHERE name = 'behind'`,
	} {
		l := d.locker(t, d.db)
		holder, err := l.Acquire(ctxFor(t, 10*time.Second), "behind")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.db.ExecContext(t.Context(), change); err != nil {
			t.Fatal(err)
		}
		select {
		case <-holder.Done():
			if !errors.Is(holder.Err(), fence.ErrLeaseLost) {
				t.Fatalf("%s: holder's lease ended with %v, want ErrLeaseLost", change, holder.Err())
			}
		case <-time.After(watchdogTTL + time.Second):
			t.Fatalf("%s: the holder still believes it holds %v later", change, watchdogTTL+time.Second)
		}
		if change[0] == 'U' && strings.Contains(change, "owner") {
			// The row still looks held by "someone else" until it expires.
			if _, err := d.db.ExecContext(t.Context(), `UPDATE fence_leases SET expires_at = '-infinity' WHERE name = 'behind'`); err != nil {
				t.Fatal(err)
			}
		}
		next, err := l.Acquire(ctxFor(t, 10*time.Second), "behind", fence.Wait(2*time.Second))
		if err != nil {
			t.Fatalf("%s: %v", change, err)
		}
		if next.Token() <= holder.Token() {
			t.Fatalf("%s: token %d after %d", change, next.Token(), holder.Token())
		}
		if err := next.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

// flakyListener confirms every LISTEN and then stops at once, as a
// connection that a proxy or idle_session_timeout keeps cutting would.
type flakyListener struct{ calls atomic.Int64 }

func (f *flakyListener) Listen(ctx context.Context, channel string) (<-chan string, error) {
	f.calls.Add(1)
	ch := make(chan string)
	close(ch)
	return ch, nil
}

// A waiter whose Listener keeps stopping as soon as it has started does not
// listen again and query in a hot loop: it backs off.
func TestListenerKeepsStopping(t *testing.T) {
	d := newDatabase(t, pg)
	holder, err := d.locker(t, d.db).Acquire(ctxFor(t, 10*time.Second), "flaky", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	var statements atomic.Int64
	f := &flakyListener{}
	l, err := pglock.New(open(t, d.dsn, &statements), &pglock.Options{Listener: f})
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(ctxFor(t, 10*time.Second), "flaky", fence.Wait(2*time.Second))
	t.Logf("Acquire = %v; %d Listens, %d statements", err, f.calls.Load(), statements.Load())
	if !errors.Is(err, fence.ErrHeld) {
		t.Errorf("Acquire = %v, want ErrHeld", err)
	}
	if n, s := f.calls.Load(), statements.Load(); n > 30 || s > 60 {
		t.Fatalf("in a 2 s wait: %d Listens and %d statements: a hot loop", n, s)
	}
}

// A Wait budget that ends while a try is blocked (here on a row lock a
// transaction elsewhere holds) is reported as the lock being held, as when
// it ends between tries, not as a backend error: fence.Lead campaigns again
// at once after ErrHeld, but backs off after an error.
func TestBudgetEndsDuringTry(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	holder, err := l.Acquire(ctxFor(t, 10*time.Second), "budget", fence.TTL(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	tx, err := d.db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(t.Context(), `SELECT 1 FROM fence_leases WHERE name = 'budget' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// The waiter wakes at the holder's expiry, and its try blocks until
	// the budget ends.
	_, err = l.Acquire(ctxFor(t, 10*time.Second), "budget", fence.Wait(1500*time.Millisecond))
	if !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire whose budget ended in a blocked try = %v, want ErrHeld", err)
	}
}

// A "database" that accepts connections and never answers: Acquire, with
// or without a Wait budget, fails by its ctx's deadline.
func TestBlackHoleDatabase(t *testing.T) {
	db := open(t, "postgres://u:p@"+silent.Addr(t)+"/db?sslmode=disable", nil)
	l, err := pglock.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]fence.Option{nil, {fence.Wait(time.Minute)}} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		start := time.Now()
		_, err := l.Acquire(ctx, "hole", opts...)
		cancel()
		if !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("Acquire on a black hole = %v", err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("Acquire with a 1 s ctx on a black hole took %v", took)
		}
	}
}

// Schema is exported for migrations, and a careless caller may hand it an
// untrusted table name. A migration runner that splits a script on ";"
// (as many do) would run SQL smuggled in the name, however it is quoted:
// Schema rejects an invalid name instead of writing SQL for it.
func TestSchemaNameCannotInject(t *testing.T) {
	d := newDatabase(t, pg)
	if _, err := d.db.ExecContext(t.Context(), `CREATE TABLE victim (x int)`); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{`x"; DROP TABLE victim; --`, "Leases", "", strings.Repeat("x", pglock.MaxTableLen+1)} {
		script, err := pglock.Schema(table)
		var ite *pglock.InvalidTableError
		if !errors.As(err, &ite) || !errors.Is(err, fence.ErrInvalidOption) || script != "" {
			t.Errorf("Schema(%q) = %q, %v; want no SQL and an *InvalidTableError", table, script, err)
		}
		for _, stmt := range strings.Split(script, ";") { // a naive migration runner
			_, _ = d.db.ExecContext(t.Context(), stmt)
		}
		var n int
		if err := d.db.QueryRowContext(t.Context(), `SELECT count(*) FROM victim`).Scan(&n); err != nil {
			t.Fatalf("after running Schema(%q) = %q: %v", table, script, err)
		}
	}
	if script, err := pglock.Schema("fence_leases"); err != nil || !strings.Contains(script, `CREATE TABLE IF NOT EXISTS "fence_leases"`) {
		t.Fatalf("Schema(fence_leases) = %q, %v", script, err)
	}
}

// TestStaleStatementDoesNotShortenLease: a renewal with a short lease (or
// the lease's own acquisition) reaches the database again after an Extend
// with a long one (held up on its way, given up on, overtaken; or resent).
// Run as written, it set expires_at to its own short lease while Deadline
// lay ahead: another Locker took the row inside the lease. expires_at of a
// live row only moves later.
func TestStaleStatementDoesNotShortenLease(t *testing.T) {
	d := newDatabase(t, pg)
	for _, stale := range []string{"renewal", "acquisition"} {
		t.Run(stale, func(t *testing.T) {
			rec := &recordingConnector{}
			cfg, err := pgx.ParseConfig(d.dsn)
			if err != nil {
				t.Fatal(err)
			}
			rec.Connector = stdlib.GetConnector(*cfg)
			db := sql.OpenDB(rec)
			t.Cleanup(func() { _ = db.Close() })
			l := d.lockerWith(t, db, pglock.Options{})
			name := "stale-" + stale
			lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if stale == "renewal" {
				if err := lease.Extend(ctxFor(t, 10*time.Second), 1234*time.Millisecond); err != nil {
					t.Fatal(err)
				}
			}
			// The last statement that set the row's expiry: the short
			// renewal, or the acquisition.
			q, args := rec.last("SET expires_at", "SET owner")
			if q == "" {
				t.Fatal("no statement setting expires_at was seen")
			}
			if err := lease.Extend(ctxFor(t, 10*time.Second), 20*time.Second); err != nil {
				t.Fatal(err)
			}
			if _, err := d.db.ExecContext(ctxFor(t, 10*time.Second), q, args...); err != nil {
				t.Fatal(err)
			}
			var left time.Duration
			var us int64
			if err := d.db.QueryRowContext(ctxFor(t, 10*time.Second),
				`SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint FROM fence_leases WHERE name = $1`, name).Scan(&us); err != nil {
				t.Fatal(err)
			}
			left = time.Duration(us) * time.Microsecond
			if want := time.Until(lease.Deadline()); left < want {
				t.Fatalf("the stale %s cut the row's expiry to %v while the lease's Deadline is %v away", stale, left, want)
			}
			if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// recordingConnector keeps the statements (and their arguments) that its
// connections run.
type recordingConnector struct {
	driver.Connector
	mu   sync.Mutex
	seen []recordedStatement
}

type recordedStatement struct {
	q    string
	args []any
}

// last returns the last statement recorded that contains any of subs.
func (r *recordingConnector) last(subs ...string) (string, []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.seen) - 1; i >= 0; i-- {
		for _, sub := range subs {
			if strings.Contains(r.seen[i].q, sub) {
				return r.seen[i].q, r.seen[i].args
			}
		}
	}
	return "", nil
}

func (r *recordingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := r.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return recordingConn{conn.(*stdlib.Conn), r}, nil
}

type recordingConn struct {
	*stdlib.Conn
	r *recordingConnector
}

func (c recordingConn) keep(q string, args []driver.NamedValue) {
	vals := make([]any, len(args))
	for i, a := range args {
		vals[i] = a.Value
	}
	c.r.mu.Lock()
	c.r.seen = append(c.r.seen, recordedStatement{q, vals})
	c.r.mu.Unlock()
}

func (c recordingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.keep(q, args)
	return c.Conn.QueryContext(ctx, q, args)
}

func (c recordingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.keep(q, args)
	return c.Conn.ExecContext(ctx, q, args)
}

// slowListener's Listen waits for its ctx: a LISTEN that gets no connection
// within the wait budget (a pool exhausted, a server slow to accept).
type slowListener struct{}

func (slowListener) Listen(ctx context.Context, channel string) (<-chan string, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A wait budget that ends while Acquire waits for its Listener to start is
// the lock still held: ErrHeld, not the budget's own context error, which
// the caller would take for its ctx's (TestListenerKeepsStopping failed so
// once under load).
func TestBudgetEndsWhileListening(t *testing.T) {
	d := newDatabase(t, pg)
	holder, err := d.locker(t, d.db).Acquire(ctxFor(t, 10*time.Second), "slow-listen", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	l, err := pglock.New(d.db, &pglock.Options{Listener: slowListener{}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(ctxFor(t, 10*time.Second), "slow-listen", fence.Wait(300*time.Millisecond))
	if !errors.Is(err, fence.ErrHeld) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire whose budget ended while its Listener started = %v, want ErrHeld", err)
	}
}
