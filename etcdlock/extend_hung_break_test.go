package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/observetest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// hangGate is a client interceptor that, while hung, holds every Txn and
// LeaseRevoke until its attempt is cut, as the only member would if it
// hung after the Grant (paused, or cut off behind an open connection): a
// request cut is never sent; one still waiting when the member answers
// again (resume) is sent then.
type hangGate struct {
	mu   sync.Mutex
	open chan struct{} // closed on resume; nil: not hung
}

func (g *hangGate) hang() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open == nil {
		g.open = make(chan struct{})
	}
}

func (g *hangGate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open != nil {
		close(g.open)
		g.open = nil
	}
}

func (g *hangGate) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == "/etcdserverpb.KV/Txn" || method == "/etcdserverpb.Lease/LeaseRevoke" {
		g.mu.Lock()
		open := g.open
		g.mu.Unlock()
		if open != nil {
			select {
			case <-open:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// hungLocker returns a Locker on a client of the shared server through a
// hangGate, its client, and the gate, resumed in t.Cleanup.
func hungLocker(t *testing.T, o *etcdlock.Options) (*etcdlock.Locker, *clientv3.Client, *hangGate) {
	t.Helper()
	g := &hangGate{}
	t.Cleanup(g.resume)
	c := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(g.intercept))
	l, err := etcdlock.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, c, g
}

// extendHung extends lease by a minute with a ctx of 1 s while the member
// hangs, and returns how long past the ctx's deadline it returned, and
// its error.
func extendHung(t *testing.T, lease fence.Lease) (over time.Duration, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	dl, _ := ctx.Deadline()
	err = lease.Extend(ctx, time.Minute)
	over = time.Since(dl)
	t.Logf("Extend with the member hung = %v, %v past its ctx's deadline", err, over.Round(time.Millisecond))
	return over, err
}

// hangExtend hangs the member behind gate and extends lease as
// extendHung does, failing the test unless Extend returned by its ctx's
// deadline and extendGrace, with ctx's error: the move's settle goes on in
// the background.
func hangExtend(t *testing.T, gate *hangGate, lease fence.Lease) {
	t.Helper()
	gate.hang()
	if over, err := extendHung(t, lease); over > extendGrace || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Extend = %v, %v past its ctx's deadline", err, over)
	}
}

// extendGrace is how long past its ctx's deadline an Extend on a member
// that hangs may return: doneGrace (100 ms) for the settle, and a margin
// for a loaded machine.
const extendGrace = 300 * time.Millisecond

// waitSettled waits, up to limit, for no Extend of l to be settling in the
// background.
func waitSettled(t *testing.T, l *etcdlock.Locker, limit time.Duration) {
	t.Helper()
	for end := time.Now().Add(limit); etcdlock.Settling(l) > 0; {
		if time.Now().After(end) {
			t.Fatalf("an Extend is still settling %v later:\n%s", limit, observetest.Stacks())
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// resumeOnceSettled waits for no Extend of l to be settling while the
// member hangs (the settle gives up), lets the member behind gate answer
// again, and waits for the revokes sent meanwhile to free the keys under
// prefix.
func resumeOnceSettled(t *testing.T, l *etcdlock.Locker, gate *hangGate, prefix string) {
	t.Helper()
	waitSettled(t, l, 5*time.Second)
	gate.resume()
	waitNoKeys(t, newClient(t, shared.Endpoints(), nil), prefix, 10*time.Second)
}

// acquire acquires key on l for ttl, failing the test if it cannot.
func acquire(t *testing.T, l *etcdlock.Locker, key string, ttl time.Duration) fence.Lease {
	t.Helper()
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), key, fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	return lease
}

// wantOneEnd fails the test unless rec is told of one lease's end, lost
// or (lost false) released, and returns the ends it was told of.
func wantOneEnd(t *testing.T, rec *observetest.Recorder, lost bool) []fence.LeaseEvent {
	t.Helper()
	ends := rec.WaitEnds(t, 1, 5*time.Second)
	if len(ends) != 1 || (ends[0].Cause == fence.Released) == lost {
		want := "lost"
		if !lost {
			want = "released"
		}
		t.Errorf("LeaseEnded %+v, want one, %s", ends, want)
	}
	return ends
}

// extendMovedLate extends lease to ttl with a ctx of 300 ms, its move
// held back, and fails the test unless Extend returns ctx's error, not
// lost, with the move's settle going on in the background; then it sends
// the move, late. The settle's first Txn is answered once answer is closed
// (never if it is nil), the Txns after it at once.
func extendMovedLate(t *testing.T, s *txnScript, l *etcdlock.Locker, lease fence.Lease, ttl time.Duration, answer <-chan struct{}) {
	t.Helper()
	s.set(func(n int, ctx context.Context, send func(context.Context) error, late func() error) error {
		switch n {
		case 0: // the move: held, sent late
			return s.hold(ctx, late)
		case 1: // the settle's first Txn
			select {
			case <-answer:
				return send(ctx)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return send(ctx)
	})
	t.Cleanup(func() { s.set(nil) })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := lease.Extend(ctx, ttl)
	t.Logf("Extend = %v", err)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend = %v, want ctx's error while the move is settled", err)
	}
	if etcdlock.Settling(l) == 0 {
		t.Fatal("nothing settling in the background")
	}
	for i, err := range s.sendHeld() {
		if err != nil {
			t.Fatalf("late move %d: %v", i, err)
		}
	}
}

// waitNoKeys waits, up to limit, for no key to be left under prefix.
func waitNoKeys(t *testing.T, admin *clientv3.Client, prefix string, limit time.Duration) {
	t.Helper()
	for end := time.Now().Add(limit); ; {
		n := countKeys(t, admin, prefix)
		if n == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d keys still under %s %v later", n, prefix, limit)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

// TestExtendHungWithinDeadline: a lease of fence.TTL(30 s), then the only
// member hangs after the Extend's Grant: the move Txn gets no answer in
// the whole ctx (1 s), nor the settling Txns, nor the revokes. The settle
// went on for twice cleanupTimeout past ctx's end, then each revoke (of
// the old etcd lease, of g) for cleanupTimeout: Extend returned 2.0 s past
// its caller's deadline. It must return by that deadline and doneGrace,
// with an error that wraps ctx's and does not say lost (the lease is not
// known lost: its key may well be in place); the settle goes on in the
// background, gives up, and the lease ends as lost, reported once; once
// the member answers, the background revokes free the lock.
func TestExtendHungWithinDeadline(t *testing.T) {
	rec := &observetest.Recorder{}
	l, _, gate := hungLocker(t, &etcdlock.Options{Observer: rec})
	lease := acquire(t, l, t.Name(), 30*time.Second)
	gate.hang()
	over, err := extendHung(t, lease)
	if over > extendGrace {
		t.Errorf("Extend returned %v past its ctx's deadline, want %v at most", over.Round(time.Millisecond), extendGrace)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Extend = %v, want an error matching context.DeadlineExceeded", err)
	}
	if errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Extend = %v: says lost while the move's outcome is being settled", err)
	}
	// Nothing answers: the settle gives up, and the lease ends as lost.
	waitDone(t, lease, 5*time.Second)
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Errorf("lease Err = %v once the settle gave up, want ErrLeaseLost", lease.Err())
	}
	resumeOnceSettled(t, l, gate, l.Prefix(t.Name()))
	if err := lease.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of the lost lease = %v, want ErrLeaseLost", err)
	}
	if ends := wantOneEnd(t, rec, true); len(ends) == 1 && ends[0].Token != lease.Token() {
		t.Errorf("LeaseEnded %+v, want the lease's", ends)
	}
}

// A Release called while the settle of an Extend that returned at its
// deadline goes on in the background waits for it (ls.op), within its
// own ctx: the member answers again meanwhile, the settle finds the key in
// place and puts it back on its etcd lease, the lease held with its
// deadline unchanged; then Release deletes the key as usual.
func TestReleaseWaitsForBackgroundSettle(t *testing.T) {
	rec := &observetest.Recorder{}
	l, _, gate := hungLocker(t, &etcdlock.Options{Observer: rec})
	admin := newClient(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), 30*time.Second)
	dl := lease.Deadline()
	hangExtend(t, gate, lease)
	if etcdlock.Settling(l) == 0 {
		t.Fatal("Extend returned at its deadline with nothing settling in the background")
	}
	released := make(chan error, 1)
	go func() { released <- lease.Release(ctxFor(t, 10*time.Second)) }()
	select {
	case err := <-released:
		t.Fatalf("Release = %v while the settle holds the lease's op", err)
	case <-time.After(100 * time.Millisecond):
	}
	gate.resume()
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("Release after the settle found the key in place = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Release still waiting 10 s after the member answered:\n%s", observetest.Stacks())
	}
	if got := lease.Deadline(); !got.Equal(dl) {
		t.Errorf("the deadline moved from %v to %v by an Extend that did not get through", dl, got)
	}
	waitSettled(t, l, 5*time.Second)
	waitNoKeys(t, admin, l.Prefix(t.Name()), 10*time.Second)
	wantOneEnd(t, rec, false)
}

// A Release with a short ctx while the settle goes on in the background
// returns by its own deadline (and doneGrace for its revoke), the lease
// ended as released; the settle then stops, and once the member answers
// the background revokes free the lock.
func TestReleaseShortDuringBackgroundSettle(t *testing.T) {
	rec := &observetest.Recorder{}
	l, _, gate := hungLocker(t, &etcdlock.Options{Observer: rec})
	lease := acquire(t, l, t.Name(), 30*time.Second)
	hangExtend(t, gate, lease)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	rdl, _ := ctx.Deadline()
	err := lease.Release(ctx)
	over := time.Since(rdl)
	t.Logf("Release during the settle = %v, %v past its deadline", err, over.Round(time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) || over > extendGrace {
		t.Errorf("Release = %v, %v past its deadline: want ctx's error by it", err, over)
	}
	if lease.Err() != fence.ErrReleased {
		t.Errorf("lease Err = %v after a Release that failed, want ErrReleased", lease.Err())
	}
	resumeOnceSettled(t, l, gate, l.Prefix(t.Name()))
	wantOneEnd(t, rec, false)
}

// A second Extend while the first one's settle goes on in the background
// waits for it within its own ctx: a short one returns by its deadline,
// not lost; once the member answers, one with time enough extends the
// lease.
func TestSecondExtendDuringBackgroundSettle(t *testing.T) {
	l, _, gate := hungLocker(t, nil)
	admin := newClient(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), 30*time.Second)
	hangExtend(t, gate, lease)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	edl, _ := ctx.Deadline()
	err := lease.Extend(ctx, time.Minute)
	over := time.Since(edl)
	t.Logf("second Extend during the settle = %v, %v past its deadline", err, over.Round(time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fence.ErrLeaseLost) || over > extendGrace {
		t.Errorf("second Extend = %v, %v past its deadline: want ctx's error by it, not lost", err, over)
	}
	gate.resume()
	if err := lease.Extend(ctxFor(t, 10*time.Second), time.Minute); err != nil {
		t.Fatalf("Extend once the member answers: %v", err)
	}
	if left := time.Until(lease.Deadline()); left < 50*time.Second {
		t.Errorf("deadline %v away after an Extend by a minute", left)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, l, 5*time.Second)
	waitNoKeys(t, admin, l.Prefix(t.Name()), 10*time.Second)
}

// Locker.Close while the settle goes on in the background waits for it
// (within its ctx), so that the user's close of the client after it does
// not cut the settle: the member answers again during Close, the settle
// finds the move applied, and Close then releases the lease, held until
// then. Close returned at once before, and the client's close then ended
// the lease as lost.
func TestCloseWaitsForBackgroundSettle(t *testing.T) {
	rec := &observetest.Recorder{}
	l, _, gate := hungLocker(t, &etcdlock.Options{Observer: rec})
	admin := newClient(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), 30*time.Second)
	hangExtend(t, gate, lease)
	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctxFor(t, 10*time.Second)) }()
	gate.resume()
	select {
	case err := <-closed:
		if n := etcdlock.Settling(l); err != nil || n > 0 {
			t.Fatalf("Locker.Close during the settle = %v with %d Extend(s) still settling", err, n)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Locker.Close still waiting 10 s after the member answered:\n%s", observetest.Stacks())
	}
	if err := lease.Err(); err != fence.ErrReleased {
		t.Fatalf("lease Err = %v after the settle found the move applied and Close released it, want fence.ErrReleased", err)
	}
	if err := lease.Release(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitNoKeys(t, admin, l.Prefix(t.Name()), 10*time.Second)
	wantOneEnd(t, rec, false)
}

// Locker.Close with a short ctx, then the user's close of the client,
// while the settle goes on in the background (the member still hung):
// Close returns by its ctx's deadline with ctx's error, the settle stops
// soon after the client is closed (no goroutine is left: TestMain's
// goleak). Close's Release of the lease, cut by its ctx as it waited for
// the settle, ended it as released, as a Release that fails does; that
// end is reported once, and a Release after it, which retries the delete,
// fails at once on the closed client.
func TestClientClosedDuringBackgroundSettle(t *testing.T) {
	rec := &observetest.Recorder{}
	l, c, gate := hungLocker(t, &etcdlock.Options{Observer: rec})
	admin := newClient(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), 30*time.Second)
	// The key stays until its etcd lease expires: no revoke can be sent
	// on a closed client. Deleted for the next run (-count).
	t.Cleanup(func() { _, _ = admin.Delete(context.Background(), l.Prefix(t.Name()), clientv3.WithPrefix()) })
	hangExtend(t, gate, lease)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	dl, _ := ctx.Deadline()
	err := l.Close(ctx)
	if over := time.Since(dl); !errors.Is(err, context.DeadlineExceeded) || over > extendGrace {
		t.Errorf("Locker.Close during the settle = %v, %v past its ctx's deadline; want its ctx's error by then", err, over)
	}
	if err := c.Close(); err != nil {
		t.Logf("client Close = %v", err)
	}
	waitSettled(t, l, 2*time.Second)
	waitDone(t, lease, 2*time.Second)
	if lease.Err() != fence.ErrReleased {
		t.Errorf("lease Err = %v with Close's Release cut during the settle, want fence.ErrReleased", lease.Err())
	}
	start := time.Now()
	if err := lease.Release(ctxFor(t, 5*time.Second)); !errors.Is(err, fence.ErrClosed) || time.Since(start) > extendGrace {
		t.Errorf("Release = %v after %v, want fence.ErrClosed (the client closed) at once", err, time.Since(start))
	}
	wantOneEnd(t, rec, false)
}

// An Observer told of the end that a background settle made (it gave up,
// nothing answered) calls the lease back (Extend, Release twice, Err):
// the settle reports the end once it has given back ls.op, so the calls
// return, and all say lost.
func TestBackgroundSettleEndReentry(t *testing.T) {
	r := observetest.NewReentry()
	l, _, gate := hungLocker(t, &etcdlock.Options{Observer: r})
	lease := acquire(t, l, t.Name(), 30*time.Second)
	r.Set(lease)
	hangExtend(t, gate, lease)
	res := r.Calls(t, 10*time.Second)
	for what, e := range map[string]error{"Extend": res.Extend, "Release": res.Release, "second Release": res.Again, "Err": res.Err, "Context's cause": res.ContextCause} {
		if !errors.Is(e, fence.ErrLeaseLost) {
			t.Errorf("%s from the callback = %v, want ErrLeaseLost", what, e)
		}
	}
	if ends := r.Ends(); len(ends) != 1 || ends[0].Cause == fence.Released {
		t.Errorf("reported ends %+v, want one, lost", ends)
	}
	resumeOnceSettled(t, l, gate, l.Prefix(t.Name()))
}

// A lease whose deadline passes while the settle goes on in the
// background (fence.TTL(2 s), an Extend with a ctx of 1 s): the lease ends
// as lost at its deadline or as the settle gives up, whichever comes
// first, reported once; the settle stops, and once the member answers
// the background revokes free the lock.
func TestLeaseDeadlineDuringBackgroundSettle(t *testing.T) {
	rec := &observetest.Recorder{}
	l, _, gate := hungLocker(t, &etcdlock.Options{Observer: rec})
	admin := newClient(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), 2*time.Second)
	hangExtend(t, gate, lease)
	waitDone(t, lease, 5*time.Second)
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Errorf("lease Err = %v, want ErrLeaseLost", lease.Err())
	}
	waitSettled(t, l, 5*time.Second)
	if err := lease.Release(ctxFor(t, 5*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release = %v, want ErrLeaseLost", err)
	}
	gate.resume()
	waitNoKeys(t, admin, l.Prefix(t.Name()), 10*time.Second)
	wantOneEnd(t, rec, true)
}

// The move that got no answer lands after Extend returned, while its
// settle goes on in the background (the settle's first Txn unanswered):
// the settle's next Txn finds the key on the new etcd lease and the
// background settle moves the lease's deadline onto it, as the foreground
// one did; the old etcd lease is revoked, and the lease goes on.
func TestLateMoveDuringBackgroundSettle(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	l, lease, old := scriptedLease(t, s, 20*time.Second)
	extendMovedLate(t, s, l, lease, time.Minute, nil) // the settle's first Txn never answered
	waitSettled(t, l, 5*time.Second)
	if err := lease.Err(); err != nil {
		t.Fatalf("lease ended: %v", err)
	}
	if left := time.Until(lease.Deadline()); left < 50*time.Second {
		t.Errorf("deadline %v away after the late move landed, want the minute asked for", left)
	}
	id, _ := keyOn(t, admin, lease)
	if id == old {
		t.Fatalf("the key is still on the old etcd lease %x", int64(old))
	}
	for end := time.Now().Add(5 * time.Second); ; {
		ttl, err := admin.TimeToLive(ctxFor(t, 5*time.Second), old)
		if err != nil {
			t.Fatal(err)
		}
		if ttl.TTL == -1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the old etcd lease %x still there (TTL %d)", int64(old), ttl.TTL)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, admin, l.Prefix(t.Name())); n != 0 {
		t.Fatalf("%d keys left after Release", n)
	}
}
