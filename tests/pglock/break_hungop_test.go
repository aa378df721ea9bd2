package pglock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// renewHangConnector's connections, while armed, hold every renewal (the
// statement of Extend and of the watchdog) until its ctx ends or the test
// lets it go: a database that stopped answering, as the driver sees it.
type renewHangConnector struct {
	driver.Connector
	armed atomic.Bool
	let   chan struct{}
	once  sync.Once
	held  atomic.Int64
	// deaf: the held renewals ignore their ctx too (a driver that does
	// not give up a statement the database does not answer).
	deaf atomic.Bool
}

// letGo disarms c and lets the held renewals run.
func (c *renewHangConnector) letGo() {
	c.armed.Store(false)
	c.once.Do(func() { close(c.let) })
}

func (c *renewHangConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return renewHangConn{conn.(*stdlib.Conn), c}, nil
}

type renewHangConn struct {
	*stdlib.Conn
	c *renewHangConnector
}

func (c renewHangConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	if c.c.armed.Load() && strings.Contains(q, "SET expires_at = greatest") {
		c.c.held.Add(1)
		done := ctx.Done()
		if c.c.deaf.Load() {
			done = nil
		}
		select {
		case <-done:
			return nil, ctx.Err()
		case <-c.c.let:
		}
	}
	return c.Conn.ExecContext(ctx, q, args)
}

// renewHangDB is a *sql.DB on a fresh database whose renewals hang once
// armed; the test's cleanup lets them go.
func renewHangDB(t *testing.T) (database, *sql.DB, *renewHangConnector) {
	t.Helper()
	d := newDatabase(t, pg)
	c := &renewHangConnector{let: make(chan struct{})}
	cfg, err := pgx.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	c.Connector = stdlib.GetConnector(*cfg)
	db := sql.OpenDB(c)
	t.Cleanup(func() { _ = db.Close() })
	t.Cleanup(c.letGo)
	return d, db, c
}

// An Extend whose statement hangs (the database stopped answering) with a
// far deadline must not hold up a Release given a short one: every call
// returns by its own ctx's deadline. Release serialises with the renewals
// (ls.op), and waited for the hung Extend whatever its own ctx said, here
// for the Extend's 20 s. The lease must end all the same (a Release's
// first call stops the lease, even when it fails), and its row, which the
// hung Extend may yet move, must be freed once it is let go.
func TestReleaseNotHeldUpByHungExtend(t *testing.T) {
	const name = "release-behind-hung-extend"
	d, db, hang := renewHangDB(t)
	l := d.locker(t, db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	hang.armed.Store(true)
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(ctxFor(t, 20*time.Second), 5*time.Second) }()
	waitUntil(t, func() bool { return hang.held.Load() == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	released := make(chan error, 1)
	go func() { released <- lease.Release(ctx) }()
	select {
	case err := <-released:
		t.Logf("Release with a 300 ms ctx behind a hung Extend = %v after %v", err, time.Since(start))
		if err == nil {
			t.Fatal("Release returned nil while the row could not be freed")
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("Release with a 300 ms ctx still waiting %v in, behind an Extend hung on the database", time.Since(start))
	}
	select {
	case <-lease.Done():
	default:
		t.Fatal("the lease did not end on Release")
	}
	// The database answers again: the Extend ends, and the row is freed,
	// whatever it did to it.
	hang.letGo()
	if err := <-extended; err == nil {
		t.Fatal("Extend returned nil after Release ended the lease")
	}
	other, err := d.locker(t, d.db).Acquire(ctxFor(t, 10*time.Second), name, fence.Wait(3*time.Second))
	if err != nil {
		t.Fatalf("the row of a released lease was not freed: %v", err)
	}
	if other.Token() <= lease.Token() {
		t.Fatalf("token %d after %d", other.Token(), lease.Token())
	}
	_ = other.Release(ctxFor(t, 5*time.Second))
}

// waitUntil polls cond, with a deadline of 10 s.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(end) {
			t.Fatal("condition not met after 10 s")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// An Extend with a short ctx behind a watchdog renewal that hangs (the
// database stopped answering; the renewal is bounded by the lease's
// deadline only, here some 4 s away) must return by its own ctx's
// deadline, not the renewal's.
func TestExtendNotHeldUpByHungRenewal(t *testing.T) {
	const name = "extend-behind-hung-renewal"
	_, db, hang := renewHangDB(t)
	l, err := pglock.New(db, &pglock.Options{WatchdogTTL: 6 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	hang.armed.Store(true)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	// The watchdog renews at a third of the TTL, 2 s in.
	waitUntil(t, func() bool { return hang.held.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(ctx, 6*time.Second) }()
	select {
	case err := <-extended:
		t.Logf("Extend with a 300 ms ctx behind a hung renewal = %v after %v", err, time.Since(start))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Extend = %v, want its ctx's error", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("Extend with a 300 ms ctx still waiting %v in, behind a renewal hung on the database (lease deadline in %v)",
			time.Since(start), time.Until(lease.Deadline()))
	}
	hang.letGo()
	if err := lease.Release(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// Extend's doc: after Release, Extend returns an error matching both
// fence.ErrLeaseLost and fence.ErrReleased. An Extend that started before
// the Release concluded, and waited for it (ls.op), returned a bare
// ErrReleased, which does not match ErrLeaseLost.
func TestExtendRacingReleaseMatchesLeaseLost(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	ctx := ctxFor(t, 30*time.Second)
	for round := range 100 {
		lease, err := l.Acquire(ctx, "extend-release", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		extended := make(chan error, 1)
		go func() {
			for {
				if err := lease.Extend(ctx, time.Minute); err != nil {
					extended <- err
					return
				}
			}
		}()
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("round %d: Release = %v", round, err)
		}
		if err := <-extended; !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
			t.Fatalf("round %d: Extend racing Release = %v, want ErrLeaseLost and ErrReleased", round, err)
		}
	}
}

// A Release that gives up on its ctx behind an Extend whose statement
// hangs on the database (here a real wait: a transaction elsewhere holds
// the lock's row) ends the lease at once and finishes in the background.
// That finish waited for the Extend's statement with no bound: with the
// caller's ctx Background, for as long as the database hung, holding a
// goroutine, and the Extend its connection, for a lease already over. The
// lease's end cuts its renewal's statement short (its answer can no longer
// count), the Extend returns the Release's end, and the background finish,
// its own statement bounded, returns every connection within a few
// seconds, while the database still hangs.
func TestReleaseGivenUpBehindHungExtendIsBounded(t *testing.T) {
	const name = "release-given-up-hung"
	d := newDatabase(t, pg)
	db := open(t, d.dsn, nil) // the Locker's own: its connections counted alone
	l := d.locker(t, db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := d.db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(t.Context(), `SELECT 1 FROM fence_leases WHERE name = $1 FOR UPDATE`, name); err != nil {
		t.Fatal(err)
	}
	blocked := func() int {
		var n int
		if err := d.db.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(context.Background(), time.Minute) }()
	waitUntil(t, func() bool { return blocked() == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := lease.Release(ctx); err == nil {
		t.Fatal("Release returned nil while the row could not be freed")
	}
	start := time.Now()
	// The background finish sends its own release, bounded by 2 s
	// (giveUpTimeout), which the row lock holds up too: every connection
	// is back within 2 s and the driver's cancellation.
	const bound = 4 * time.Second
	select {
	case err := <-extended:
		t.Logf("Extend(ctx Background) hung on the database = %v, %v after the Release gave up", err, time.Since(start))
		if !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
			t.Fatalf("Extend cut short by the Release = %v, want ErrLeaseLost and ErrReleased", err)
		}
	case <-time.After(bound):
		t.Fatalf("Extend(ctx Background) still hung %v after a Release ended the lease (%d statements waiting on the row, %d of the Locker's connections in use): the background finish waits for it",
			time.Since(start), blocked(), db.Stats().InUse)
	}
	for db.Stats().InUse != 0 || blocked() != 0 {
		if time.Since(start) > bound {
			t.Fatalf("%v after a Release gave up on a hung database, %d of the Locker's connections in use, %d statements waiting on the row",
				time.Since(start), db.Stats().InUse, blocked())
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	t.Logf("the Locker's connections all back %v after the Release gave up", time.Since(start))
	// The database answers again: a second Release frees the row.
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatalf("Release again once the database answers = %v", err)
	}
	other, err := l.Acquire(ctxFor(t, 5*time.Second), name)
	if err != nil {
		t.Fatalf("the row of a released lease was not freed: %v", err)
	}
	_ = other.Release(ctxFor(t, 5*time.Second))
}

// The background finish of a Release that gave up waits for the renewal
// under way only so long: a driver that does not give up the renewal's
// statement (deaf to its ctx, which the lease's end cancelled) on a
// database that does not answer held it, and the lock's row, for as long
// as the statement hung. It frees the row without the renewal's turn once
// the bound has passed, while that statement still hangs, and a second
// Release then returns nil.
func TestReleaseGivenUpBehindDeafRenewalFreesRow(t *testing.T) {
	const name = "release-behind-deaf-renewal"
	d, db, hang := renewHangDB(t)
	l := d.locker(t, db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	hang.deaf.Store(true)
	hang.armed.Store(true)
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(context.Background(), time.Minute) }()
	waitUntil(t, func() bool { return hang.held.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := lease.Release(ctx); err == nil {
		t.Fatal("Release returned nil behind a hung renewal")
	}
	start := time.Now()
	// The lease time is a minute: the lock is free within the Wait only
	// if the background finish freed the row.
	other, err := d.locker(t, d.db).Acquire(ctxFor(t, 10*time.Second), name, fence.Wait(5*time.Second))
	if err != nil {
		t.Fatalf("the row of a lease whose Release gave up behind a renewal deaf to its ctx is still held %v on: %v", time.Since(start), err)
	}
	t.Logf("row freed %v after the Release gave up, the renewal still hung", time.Since(start))
	select {
	case err := <-extended:
		t.Fatalf("the deaf renewal returned: %v", err)
	default:
	}
	if err := lease.Release(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatalf("Release again = %v, want nil: the row was freed", err)
	}
	hang.letGo()
	if err := <-extended; !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend let go after the release = %v, want ErrLeaseLost", err)
	}
	if other.Token() <= lease.Token() {
		t.Fatalf("token %d after %d", other.Token(), lease.Token())
	}
	_ = other.Release(ctxFor(t, 5*time.Second))
}
