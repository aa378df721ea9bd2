package pglock_test

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"
)

// signalConn is a net.Conn that counts its writes once armed, and hands
// each write that terminates a backend to onTerminate first, which may
// cut it (an error: nothing is sent) or hold it.
// signalConn is a net.Conn that the test can cut from the client's side (a
// local network error), that counts its writes once armed, and that calls
// onTerminate before a write that terminates a backend (its error fails
// the write).
type signalConn struct {
	net.Conn
	armed       *atomic.Bool
	writes      *atomic.Int64
	onTerminate func() error
}

func (c signalConn) Write(p []byte) (int, error) {
	if c.armed.Load() {
		c.writes.Add(1)
	}
	if bytes.Contains(p, []byte("pg_terminate_backend")) {
		if err := c.onTerminate(); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(p)
}

// An Acquire whose earlier try went to a backend that stalled (SIGSTOP)
// takes the lock with a later try, and the signal to the stalled backend
// is lost: the Acquire's ctx ends as its statement is written (ctxCut), or
// the statement fails on a connection cut like the stalled one, the
// Acquire's ctx alive (stmtFailed). Were the lease returned, its Release
// could free the row before any later signal (held here, with ctxCut,
// until the backend has resumed, as a loaded machine may schedule it; with
// stmtFailed there was none), and the stalled try, resumed, take the freed
// row back: held by nobody for its lease time. Whatever Acquire returns,
// once any lease it gave is released and the stalled backend has resumed
// and gone, the lock must be free.
func TestStaleSignalCutByCtxReleaseOvertakes(t *testing.T) {
	t.Run("ctxCut", func(t *testing.T) { testStaleSignalLost(t, true) })
	t.Run("stmtFailed", func(t *testing.T) { testStaleSignalLost(t, false) })
}

func testStaleSignalLost(t *testing.T, cancelCtx bool) {
	const name = "stale-signal-cut"
	d := newDatabase(t, pg)
	var (
		armed      atomic.Bool
		writes     atomic.Int64
		terminates atomic.Int64
		cancelAcq  context.CancelFunc
		letSignal  = make(chan struct{})
		letOnce    sync.Once
	)
	let := func() { letOnce.Do(func() { close(letSignal) }) }
	t.Cleanup(let)
	onTerminate := func() error {
		if terminates.Add(1) == 1 {
			// The signal is lost, and with ctxCut the Acquire's ctx
			// ends as it goes out.
			if cancelCtx {
				cancelAcq()
			}
			return errors.New("cut")
		}
		if !cancelCtx {
			return nil
		}
		// Later signals (the background one, or a give-up's) come late.
		select {
		case <-letSignal:
		case <-time.After(10 * time.Second):
		}
		return nil
	}
	// A pool of one: the first try goes to the backend whose PID is read.
	l, db, pid, stalled := poolOfOne(t, d, name, func(c net.Conn) net.Conn {
		return signalConn{c, &armed, &writes, onTerminate}
	})
	before := goleak.IgnoreCurrent()
	resume := stopBackend(t, pid)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cancelAcq = cancel
	type result struct {
		lease fence.Lease
		err   error
	}
	acquired := make(chan result, 1)
	armed.Store(true)
	go func() {
		lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute), fence.Wait(10*time.Second))
		acquired <- result{lease, err}
	}()
	waitUntil(t, func() bool { return writes.Load() > 0 }) // the try is in the stalled backend's socket
	armed.Store(false)
	db.SetMaxOpenConns(3) // the signals need not wait for the lease's statements
	_ = stalled.Close()
	var r result
	if cancelCtx {
		r = <-acquired
	} else {
		// A give-up's termination waits for the stalled backend to go:
		// let it resume then.
		end := time.Now().Add(10 * time.Second)
		for got := false; !got; {
			select {
			case r = <-acquired:
				got = true
				continue
			case <-time.After(10 * time.Millisecond): // polling with a deadline
			}
			if terminating(t, d) {
				resume()
				r, got = <-acquired, true
			} else if time.Now().After(end) {
				t.Fatal("Acquire neither returned nor terminated the stalled backend in 10 s")
			}
		}
	}
	t.Logf("Acquire: lease %v, err %v", r.lease, r.err)
	if r.err == nil {
		if err := r.lease.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	} else if !cancelCtx || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Acquire = %v, want a lease or its ctx's error", r.err)
	}
	// The backend resumes before the late signal: it runs the try, or
	// dies, and goes (its client closed the connection).
	resume()
	waitBackendGone(t, d, pid)
	let()
	if owner := waitRowFree(t, d, name, 5*time.Second); owner != "" {
		t.Fatalf("the stalled try took the row back after the Acquire (lease released, or none given): the row is %q's", owner)
	}
	// Nothing the Acquire started (a give-up, a signal) lingers.
	var leaked error
	if !pollFor(3*time.Second, func() bool { leaked = goleak.Find(before); return leaked == nil }) {
		t.Fatalf("goroutines left behind: %v", leaked)
	}
}

// An Acquire's signal to a stalled backend, now sent before the lease is
// returned, on a server that hangs on it (here the view it reads waits
// for a lock on pg_authid that a transaction holds): the Acquire must
// still return by its ctx's deadline, with no lease.
func TestStaleSignalHungKeepsDeadline(t *testing.T) {
	const name = "stale-signal-hung"
	d := newDatabase(t, pg)
	locker, err := d.db.Conn(ctxFor(t, 10*time.Second)) // opened before the lock: new connections read pg_authid
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Close() })
	var (
		armed      atomic.Bool
		writes     atomic.Int64
		terminates atomic.Int64
		locked     = make(chan struct{})
		unlock     = make(chan struct{})
		unlockOnce sync.Once
	)
	letGo := func() { unlockOnce.Do(func() { close(unlock) }) }
	t.Cleanup(letGo)
	go func() {
		<-locked
		tx, err := locker.BeginTx(context.Background(), nil)
		if err != nil {
			t.Error(err)
			return
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.Exec(`LOCK TABLE pg_catalog.pg_authid IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Error(err)
		}
		locked <- struct{}{}
		<-unlock
	}()
	onTerminate := func() error {
		if terminates.Add(1) == 1 {
			locked <- struct{}{}
			<-locked // the lock is held: the signal hangs at the server
		}
		return nil
	}
	l, _, pid, stalled := poolOfOne(t, d, name, func(c net.Conn) net.Conn {
		return signalConn{c, &armed, &writes, onTerminate}
	})
	resume := stopBackend(t, pid)

	const budget = 1500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	type result struct {
		lease fence.Lease
		err   error
		took  time.Duration
	}
	acquired := make(chan result, 1)
	armed.Store(true)
	go func() {
		start := time.Now()
		lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute), fence.Wait(10*time.Second))
		acquired <- result{lease, err, time.Since(start)}
	}()
	waitUntil(t, func() bool { return writes.Load() > 0 })
	armed.Store(false)
	_ = stalled.Close()
	r := <-acquired
	letGo()
	resume()
	t.Logf("Acquire: lease %v, err %v, after %v", r.lease, r.err, r.took)
	if terminates.Load() == 0 {
		t.Fatal("no signal was sent: the attack did not happen")
	}
	if r.took > budget+500*time.Millisecond {
		t.Errorf("Acquire with a %v ctx returned after %v, held up by the hung signal", budget, r.took)
	}
	if r.err == nil {
		_ = r.lease.Release(ctxFor(t, 10*time.Second))
		t.Fatal("Acquire returned a lease whose stalled backend was not signalled")
	}
}

// stallingConn stops (SIGSTOP) the backend of each connection on which a
// try is written while stall says so, and then cuts the connection on
// the client's side: the try waits in the stopped backend's socket.
type stallingConn struct {
	net.Conn
	name  string // the lock's
	stall func(c net.Conn) bool
}

func (c stallingConn) Write(p []byte) (int, error) {
	cut := len(p) > 0 && p[0] == 'B' && bytes.Contains(p, []byte(c.name)) && c.stall(c.Conn) // the try's Bind
	n, err := c.Conn.Write(p)
	if cut {
		_ = c.Conn.Close()
	}
	return n, err
}

// Two tries of one Acquire go to backends that stall, and the third takes
// the lock: both stalled backends, not only the last, must have been
// signalled when Acquire returns, so that neither takes the row back once
// the lease is released and they resume.
func TestSeveralStaleBackendsSignalledBeforeLease(t *testing.T) {
	const name = "several-stale"
	d := newDatabase(t, pg)
	cfg, err := pgx.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	var (
		armed atomic.Bool
		mu    sync.Mutex
		pids  []int
	)
	stall := func(c net.Conn) bool {
		if !armed.Load() {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if len(pids) == 2 {
			return false
		}
		var pid int
		port := c.LocalAddr().(*net.TCPAddr).Port
		if err := d.db.QueryRowContext(context.Background(),
			`SELECT pid FROM pg_stat_activity WHERE client_port = $1`, port).Scan(&pid); err != nil {
			t.Errorf("backend of port %d: %v", port, err)
			return false
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Errorf("stop backend %d: %v", pid, err)
			return false
		}
		pids = append(pids, pid)
		return true
	}
	resumeAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resumeAll)
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return stallingConn{c, name, stall}, nil
	}
	db := sql.OpenDB(stdlib.GetConnector(*cfg))
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	l := d.locker(t, db)
	makeRow(t, l, name)
	armed.Store(true)
	lease, err := l.Acquire(ctxFor(t, 20*time.Second), name, fence.TTL(time.Minute), fence.Wait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	stopped := append([]int(nil), pids...)
	mu.Unlock()
	if len(stopped) != 2 {
		t.Fatalf("%d backends stalled, want 2", len(stopped))
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	resumeAll()
	gone := pollFor(10*time.Second, func() bool {
		var n int
		if err := d.db.QueryRowContext(ctxFor(t, 5*time.Second),
			`SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, stopped).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if !gone {
		t.Fatalf("backends %v still there 10 s after they resumed", stopped)
	}
	if owner := rowOwner(t, d, name); owner != "" {
		t.Fatalf("a stalled try ran after the release: the row is %q's", owner)
	}
}

// rotatingConnector opens its connections as each of its connectors in
// turn: credentials that rotate (a role per lease of a secrets manager).
type rotatingConnector struct {
	cs []driver.Connector
	n  *atomic.Int64
}

func (r rotatingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	return r.cs[int(r.n.Add(1)-1)%len(r.cs)].Connect(ctx)
}

func (r rotatingConnector) Driver() driver.Driver { return r.cs[0].Driver() }

// An Acquire's try stalls on a backend of role A, and its next try takes
// the lock on a connection of role B (rotating credentials): B may not
// terminate A's backends, nor see their client_port, so the signal
// matches nothing. Were the lease returned all the same, its Release
// would free the row, and the stalled try, resumed, take it back.
func TestStaleSignalOtherRoleReleaseOvertakes(t *testing.T) {
	t.Skip("limitation, not fixed: without the right to terminate the stalled backend (here another role's), neither this signal nor a give-up's termination can stop it; the row, freed by the Release (or by a give-up), is taken back when it resumes, held by nobody for the lease time (fails on c3f71b7 and after its fix)")
	const name = "stale-other-role"
	d := newDatabase(t, pg)
	var (
		cs     []driver.Connector
		cut    atomic.Pointer[net.Conn]
		armed  atomic.Bool
		writes atomic.Int64
	)
	for i, role := range []string{"pglock_rot_a", "pglock_rot_b"} {
		cfg, err := pgx.ParseConfig(plainRoleDSN(t, d, role, -1))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			dial := cfg.DialFunc
			cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := dial(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				cut.Store(&c)
				return signalConn{c, &armed, &writes, func() error { return nil }}, nil
			}
		}
		cs = append(cs, stdlib.GetConnector(*cfg))
	}
	db := sql.OpenDB(rotatingConnector{cs, new(atomic.Int64)})
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	l := d.locker(t, db)
	makeRow(t, l, name)
	pid := backendPID(t, db) // role A's
	resume := stopBackend(t, pid)
	armed.Store(true)
	type result struct {
		lease fence.Lease
		err   error
	}
	acquired := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctxFor(t, 20*time.Second), name, fence.TTL(time.Minute), fence.Wait(10*time.Second))
		acquired <- result{lease, err}
	}()
	waitUntil(t, func() bool { return writes.Load() > 0 }) // the try is in the stalled backend's socket
	armed.Store(false)
	_ = (*cut.Load()).Close()
	r := <-acquired
	t.Logf("Acquire: lease %v, err %v", r.lease, r.err)
	if r.err == nil {
		if err := r.lease.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	resume()
	waitBackendGone(t, d, pid)
	if owner := waitRowFree(t, d, name, 5*time.Second); owner != "" {
		t.Fatalf("the stalled try took the row back after the Acquire: the row is %q's", owner)
	}
}
