package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// endRecorder is a fence.Observer that counts the end reports per token,
// and calls onEnd (if set) from inside each report, as a user's Observer
// that cleans up (Release, Extend, Acquire) would.
type endRecorder struct {
	fence.NopObserver
	mu    sync.Mutex
	ends  map[fence.Token][]fence.LeaseEvent
	onEnd func(fence.LeaseEvent)
}

func (r *endRecorder) LeaseEnded(ev fence.LeaseEvent) {
	r.mu.Lock()
	if r.ends == nil {
		r.ends = make(map[fence.Token][]fence.LeaseEvent)
	}
	r.ends[ev.Token] = append(r.ends[ev.Token], ev)
	f := r.onEnd
	r.mu.Unlock()
	if f != nil {
		f(ev)
	}
}

func (r *endRecorder) of(tok fence.Token) []fence.LeaseEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]fence.LeaseEvent(nil), r.ends[tok]...)
}

// releasingHandler is a slog.Handler that, on the "lease lost" line,
// calls Release of the lease with that token (from inside the handler).
type releasingHandler struct {
	mu     *sync.Mutex
	leases map[int64]fence.Lease
	errs   chan error
}

func (h releasingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h releasingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h releasingHandler) WithGroup(string) slog.Handler            { return h }
func (h releasingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "zklock: lease lost" {
		return nil
	}
	var tok int64
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "token" {
			tok = a.Value.Int64()
		}
		return true
	})
	h.mu.Lock()
	ls := h.leases[tok]
	h.mu.Unlock()
	if ls != nil {
		h.errs <- ls.Release(context.Background())
	}
	return nil
}

// A grant of another session (the connection's session ended and
// go-zookeeper opened a new one) ends every lease of the old one at once,
// from the logging goroutine's retime, with many leases held, a Logger
// whose handler calls Release on the "lease lost" line, and an Observer
// that calls Release, Extend and Acquire from inside the end report (the
// grant here logged by the test, as go-zookeeper's connect goroutine
// would, and before it serves the connection): nothing is reported on the
// logging goroutine, nothing deadlocks, each lease ends within a moment of the grant with
// ErrLeaseLost naming the ended session, is reported once, as removed,
// and the SessionTimeouts forgets every one.
func TestRetimeNewSessionManyLeasesCallbacks(t *testing.T) {
	srv := sharedZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const asked = 8 * time.Second
	conn, st := exactConn(t, srv.Addr, asked)
	h := releasingHandler{mu: new(sync.Mutex), leases: make(map[int64]fence.Lease), errs: make(chan error, 1000)}
	rec := &endRecorder{}
	l, err := zklock.New(conn, asked, zklock.WithSessionTimeouts(st), zklock.WithObserver(rec), zklock.WithLogger(slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	obsErrs := make(chan error, 1000)
	acquired := make(chan error, 1000)
	var inObserver sync.WaitGroup
	inObserver.Add(n)
	printed := make(chan struct{}) // closed once the grant's line is logged
	rec.onEnd = func(ev fence.LeaseEvent) {
		h.mu.Lock()
		ls := h.leases[int64(ev.Token)]
		h.mu.Unlock()
		if ls == nil {
			return
		}
		defer inObserver.Done()
		select {
		case <-printed:
		case <-time.After(5 * time.Second):
			obsErrs <- fmt.Errorf("the end report of %v waited 5s for the grant's logging to return: reported on the logging goroutine", ev.Token)
		}
		obsErrs <- ls.Release(context.Background())
		if err := ls.Extend(context.Background(), time.Second); err == nil {
			obsErrs <- fmt.Errorf("Extend from the Observer of an ended lease = nil")
		}
		actx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		nl, err := l.Acquire(actx, ev.Name+"-again")
		if err == nil {
			_ = nl.Release(context.Background())
		}
		acquired <- err
	}
	leases := make([]fence.Lease, n)
	for i := range leases {
		if leases[i], err = l.Acquire(ctx, fmt.Sprintf("retime-many-%d", i)); err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		h.leases[int64(leases[i].Token())] = leases[i]
		h.mu.Unlock()
	}
	if got := st.Following(); got != n {
		t.Fatalf("the SessionTimeouts follows %d leases, want %d", got, n)
	}
	old := conn.SessionID()
	granted := time.Now()
	// The grant of another session, as go-zookeeper logs it.
	st.Printf("authenticated: id=%d, timeout=%d", old+1, int32(asked.Milliseconds()))
	close(printed)
	for i, ls := range leases {
		select {
		case <-ls.Done():
		case <-time.After(time.Until(granted.Add(2 * time.Second))):
			t.Fatalf("lease %d still held 2s after the grant of another session: Err %v, Deadline %v away", i, ls.Err(), time.Until(ls.Deadline()))
		}
		if err := ls.Err(); !errors.Is(err, fence.ErrLeaseLost) || !strings.Contains(err.Error(), "session") {
			t.Errorf("lease %d: Err = %v, want ErrLeaseLost naming the ended session", i, err)
		}
	}
	t.Logf("all %d leases ended %v after the grant", n, time.Since(granted).Round(time.Millisecond))
	waitFor(t, func() bool {
		for _, ls := range leases {
			if len(rec.of(ls.Token())) == 0 {
				return false
			}
		}
		return true
	})
	waitFor(t, func() bool { return st.Following() == 0 })
	for i, ls := range leases {
		evs := rec.of(ls.Token())
		if len(evs) != 1 || evs[0].Cause != fence.LostRemoved {
			t.Errorf("lease %d: end reports %+v, want one, removed", i, evs)
		}
		if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
			t.Errorf("lease %d: Release = %v, want ErrLeaseLost", i, err)
		}
	}
	for range 2 * n {
		select {
		case err := <-obsErrs:
			if !errors.Is(err, fence.ErrLeaseLost) {
				t.Errorf("from the Observer: %v", err)
			}
		case err := <-h.errs:
			if !errors.Is(err, fence.ErrLeaseLost) {
				t.Errorf("Release from the Logger's handler = %v, want ErrLeaseLost", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a callback's Release did not return")
		}
	}
	inObserver.Wait()
	close(acquired)
	for err := range acquired {
		t.Logf("Acquire from the Observer: %v", err)
		break
	}
	waitFor(t, func() bool { return l.Background() == 0 })
}

// Grants logged back to back (the connection's own session, its timeout
// unchanged) while leases are acquired, extended and released, some with
// fence.TTL running out: retime on the logging goroutine against newLease,
// touch, Extend, expire and Release, under -race; no lease of the healthy
// session is lost but by its TTL, and the SessionTimeouts forgets every one.
func TestRetimeGrantStorm(t *testing.T) {
	srv := sharedZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const asked = 8 * time.Second
	conn, st := exactConn(t, srv.Addr, asked)
	rec := &endRecorder{}
	l, err := zklock.New(conn, asked, zklock.WithSessionTimeouts(st), zklock.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return conn.State() == zk.StateHasSession })
	got, session := time.Duration(0), int64(0)
	waitFor(t, func() bool { got, session = st.Timeout(); return session != 0 })
	stop := make(chan struct{})
	stormed := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				stormed <- n
				return
			default:
			}
			st.Printf("authenticated: id=%d, timeout=%d", session, int32(got.Milliseconds()))
			n++
		}
	}()
	var (
		mu  sync.Mutex
		all = map[fence.Lease]bool{} // the lease: with a TTL that runs out
	)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				short := i%5 == 0
				opts := []fence.Option{fence.Wait(5 * time.Second)}
				if short {
					opts = append(opts, fence.TTL(fence.MinTTL))
				}
				ls, err := l.Acquire(ctx, fmt.Sprintf("storm-%d", w), opts...)
				if err != nil {
					t.Errorf("worker %d: Acquire: %v", w, err)
					return
				}
				mu.Lock()
				all[ls] = short
				mu.Unlock()
				if short {
					<-ls.Done()
					continue
				}
				if err := ls.Extend(ctx, time.Second); err != nil {
					t.Errorf("worker %d: Extend: %v", w, err)
				}
				if err := ls.Release(ctx); err != nil {
					t.Errorf("worker %d: Release: %v", w, err)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	t.Logf("%d grants logged over %d leases", <-stormed, len(all))
	waitFor(t, func() bool { return st.Following() == 0 })
	waitFor(t, func() bool { return l.Background() == 0 })
	for ls, short := range all {
		waitFor(t, func() bool { return len(rec.of(ls.Token())) > 0 })
		evs := rec.of(ls.Token())
		want := fence.Released
		if short {
			want = fence.LostExpired
		}
		if len(evs) != 1 || evs[0].Cause != want {
			t.Errorf("lease %v: end reports %+v, want one, %s", ls, evs, want)
		}
	}
}

// releaseThenBlock is a slog.Handler that, on the monitor's "check
// failed" line, releases the lease, tells released, and blocks until
// unblock is closed.
type releaseThenBlock struct {
	lease    *fence.Lease
	once     *sync.Once
	released chan error
	unblock  chan struct{}
}

func (h releaseThenBlock) Enabled(context.Context, slog.Level) bool { return true }
func (h releaseThenBlock) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h releaseThenBlock) WithGroup(string) slog.Handler            { return h }
func (h releaseThenBlock) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "zklock: check of the lease's node failed" {
		return nil
	}
	h.once.Do(func() {
		h.released <- (*h.lease).Release(context.Background())
		<-h.unblock
	})
	return nil
}

// A lease released from the Logger's handler, on its monitor's "check
// failed" line (Release does not wait for that monitor), stays followed
// by the SessionTimeouts while the handler runs on: grants then, of its
// session and of another, leave it as the Release ended it (Err, one
// report, the Release's result again), and the SessionTimeouts forgets it
// once the handler returns.
func TestRetimeLeaseReleasedInsideHandler(t *testing.T) {
	srv := sharedZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const asked = 8 * time.Second
	conn, st := exactConn(t, srv.Addr, asked)
	var lease fence.Lease
	h := releaseThenBlock{lease: &lease, once: new(sync.Once), released: make(chan error, 1), unblock: make(chan struct{})}
	unblock := sync.OnceFunc(func() { close(h.unblock) })
	defer unblock()
	rec := &endRecorder{}
	l, err := zklock.New(conn, asked, zklock.WithSessionTimeouts(st), zklock.WithObserver(rec), zklock.WithLogger(slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	const name = "released-inside-handler"
	if lease, err = l.Acquire(ctx, name); err != nil {
		t.Fatal(err)
	}
	node := lockNodes(t, conn, name)[0]
	if _, err := conn.Set(node, []byte("changed"), -1); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.SetACL(node, zk.WorldACL(zk.PermWrite|zk.PermAdmin|zk.PermDelete), -1); err != nil {
		t.Fatal(err)
	}
	// The node's data was changed: the Release finds it so, and reports
	// the lease lost (its delete is at the version it created).
	var relErr error
	select {
	case relErr = <-h.released:
		if !errors.Is(relErr, fence.ErrLeaseLost) {
			t.Fatalf("Release from the handler = %v, want ErrLeaseLost (the node was changed)", relErr)
		}
	case <-time.After(asked):
		t.Fatal("no failed check logged")
	}
	got, session := st.Timeout()
	st.Printf("authenticated: id=%d, timeout=%d", session, int32(got.Milliseconds()))
	st.Printf("authenticated: id=%d, timeout=%d", session+1, int32(got.Milliseconds()))
	if err := lease.Err(); err != relErr {
		t.Errorf("Err after the grants = %v, want the Release's %v", err, relErr)
	}
	unblock()
	waitFor(t, func() bool { return st.Following() == 0 })
	waitFor(t, func() bool { return len(rec.of(lease.Token())) > 0 })
	if evs := rec.of(lease.Token()); len(evs) != 1 || evs[0].Cause != fence.LostRemoved {
		t.Errorf("end reports %+v, want one, removed", evs)
	}
	if err := lease.Release(ctx); err != relErr {
		t.Errorf("Release again = %v, want the first's result %v", err, relErr)
	}
	waitFor(t, func() bool { return l.Background() == 0 })
}
