package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/observetest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// txnHungLocker is hungLocker with a gate that holds the Txns alone: the
// revokes get through, so that no revoke is left to the background for
// Close to wait for (see TestCloseWaitsForBackgroundRevokes), and the
// settles are all Close waits for.
func txnHungLocker(t *testing.T, o *etcdlock.Options) (*etcdlock.Locker, *hangGate) {
	t.Helper()
	g := &hangGate{}
	t.Cleanup(g.resume)
	txnOnly := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/etcdserverpb.KV/Txn" {
			return g.intercept(ctx, method, req, reply, cc, invoker, opts...)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(txnOnly))
	l, err := etcdlock.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return l, g
}

// closer is an Observer whose LeaseEnded closes the Locker ("on lease
// lost, shut down"), within a ctx of closeWait, and hands back what Close
// returned and how long it took.
type closer struct {
	fence.NopObserver
	mu     sync.Mutex
	l      *etcdlock.Locker
	closed chan closeResult
}

type closeResult struct {
	err  error
	took time.Duration
}

// closeWait bounds the Close of closer's callback: long against the
// callback's own work (no etcd call: the Locker keeps no spare here).
const closeWait = 3 * time.Second

func (c *closer) LeaseEnded(fence.LeaseEvent) {
	c.mu.Lock()
	l := c.l
	c.mu.Unlock()
	if l == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	start := time.Now()
	err := l.Close(ctx)
	select {
	case c.closed <- closeResult{err, time.Since(start)}:
	default:
	}
}

// An Observer told of the end that a background settle made (it gave up,
// nothing answered) closes the Locker: Close waited for the settles to
// be counted out, and the settle that called it is counted out only once
// its report has returned, so Close waited for itself until its ctx
// ended (for ever with context.Background()), and said an Extend was
// still settling. The settle has updated the lease and given back ls.op by
// then: Close must not wait for its report.
func TestCloseFromBackgroundSettleEnd(t *testing.T) {
	obs := &closer{closed: make(chan closeResult, 1)}
	l, gate := txnHungLocker(t, &etcdlock.Options{Observer: obs})
	// The lease's run, which would race the settle for the report (it
	// returns once the lease ends, and reports it too), never starts: the
	// report is the settle's.
	etcdlock.HoldRuns(l)
	lease := acquire(t, l, t.Name(), 30*time.Second)
	obs.mu.Lock()
	obs.l = l
	obs.mu.Unlock()
	hangExtend(t, gate, lease)
	var res closeResult
	select {
	case res = <-obs.closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("no end reported 10 s after the Extend:\n%s", observetest.Stacks())
	}
	t.Logf("Close from the settle's report = %v after %v", res.err, res.took.Round(time.Millisecond))
	if res.err != nil || res.took > closeWait/2 {
		t.Errorf("Close from the settle's report = %v after %v: waited for the report that called it", res.err, res.took.Round(time.Millisecond))
	}
	resumeOnceSettled(t, l, gate, l.Prefix(t.Name()))
}

// Locker.Close waits for the settles under way when it is called, not for
// those that start after: Extends of other leases that kept going to the
// background one after the other (the member hung, each Extend with a
// ctx of 300 ms, each settle giving up a second after) kept the count of
// settles above 0, and Close waited for the whole chain (or until its
// ctx ended: for ever with context.Background() while they go on). Close
// now refuses the Extends called after it (fence.ErrClosed, sending
// nothing: TestExtendAfterClose), so no chain outlasts it: it returns
// once the first settle, and the Extend of the chain under way as it was
// called, are through, well before a chain of chainLen settles (a second
// or more each) would be, and the rest of the chain fails at once (with
// fence.ErrClosed, or, once Close has released the lease,
// fence.ErrReleased).
func TestCloseWaitsOnlyForSettlesUnderWay(t *testing.T) {
	const chainLen = 12
	l, gate := txnHungLocker(t, nil)
	leases := make([]fence.Lease, chainLen)
	for i := range leases {
		leases[i] = acquire(t, l, t.Name()+"-"+string(rune('a'+i)), 30*time.Second)
	}
	gate.hang()
	extend := func(lease fence.Lease) error {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		return lease.Extend(ctx, time.Minute)
	}
	_ = extend(leases[0])
	if etcdlock.Settling(l) == 0 {
		t.Fatal("nothing settling in the background after the first Extend")
	}
	chainDone := make(chan struct{})
	refused := 0
	go func() {
		defer close(chainDone)
		for _, lease := range leases[1:] {
			if err := extend(lease); errors.Is(err, fence.ErrClosed) || errors.Is(err, fence.ErrReleased) {
				refused++
			}
		}
	}()
	start := time.Now()
	err := l.Close(ctxFor(t, 30*time.Second))
	took := time.Since(start)
	<-chainDone
	t.Logf("Locker.Close = %v after %v; %d of the chain's %d Extends refused", err, took.Round(time.Millisecond), refused, chainLen-1)
	if took > 5*time.Second {
		t.Errorf("Locker.Close = %v after %v: it waited for settles that started after it", err, took.Round(time.Millisecond))
	}
	if refused < chainLen-3 {
		t.Errorf("%d of the chain's %d Extends refused after Close, want all but those under way as it was called", refused, chainLen-1)
	}
	waitSettled(t, l, 5*time.Second)
	gate.resume()
	// The settles that gave up ended their leases as lost, and their
	// revokes, answered, freed their keys; Close released the others.
	for _, lease := range leases {
		_ = lease.Release(ctxFor(t, 10*time.Second))
	}
	// The keys of all the leases: Prefix(t.Name()+"-a") and so on.
	waitNoKeys(t, newClient(t, shared.Endpoints(), nil), strings.TrimSuffix(l.Prefix(t.Name()), "/"), 10*time.Second)
}

// Locker.Close during a settle that gives up (the member hung for longer
// than its grace): the settle ends the lease as lost and revokes its etcd
// lease, which holds the key, but that revoke does not get through and is
// left to be retried in the background. Close returned nil as the settle
// ended, and the user's close of the client after it cut the retry: once
// the member answered again the key stayed, holding the lock for nobody
// until its etcd lease expired (30 s here, the whole lease time). Close
// must wait, within its ctx, for the revokes under way too, so that the
// client can be closed after it without cutting them.
func TestCloseWaitsForBackgroundRevokes(t *testing.T) {
	closeDuringSettle(t, "Locker.Close", nil)
}

// closeDuringSettle acquires a lease of 30 s on a hungLocker and hangs
// the member during its Extend (hangExtend), so that the move's settle
// goes on in the background; it calls before with the Locker, if not nil,
// then Locker.Close (what, in the messages) with a ctx of 10 s. Once the
// settle has given up it lets the member answer again, and closes the
// client after Close has returned, as a user does. It fails the test
// unless Close returned nil and the revoke of the lease's etcd lease,
// which holds the key, then freed the key.
func closeDuringSettle(t *testing.T, what string, before func(*etcdlock.Locker)) {
	l, c, gate := hungLocker(t, nil)
	admin := newClient(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), 30*time.Second)
	// Left for its etcd lease's TTL if the revoke is cut: deleted for the
	// next run (-count).
	t.Cleanup(func() { _, _ = admin.Delete(context.Background(), l.Prefix(t.Name()), clientv3.WithPrefix()) })
	hangExtend(t, gate, lease)
	if before != nil {
		before(l)
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctxFor(t, 10*time.Second)) }()
	waitSettled(t, l, 5*time.Second)
	// Ended by the settle that gave up, as lost, or before it, as
	// released, by the Release of a Close called before (whose ctx ended
	// as it waited for the settle).
	if err := lease.Err(); !errors.Is(err, fence.ErrLeaseLost) && (before == nil || err != fence.ErrReleased) {
		t.Fatalf("lease Err = %v once the settle gave up, want ErrLeaseLost", err)
	}
	gate.resume()
	wantClosed(t, closed, what)
	if err := c.Close(); err != nil {
		t.Logf("client Close = %v", err)
	}
	waitNoKeys(t, admin, l.Prefix(t.Name()), 5*time.Second)
}

// wantClosed waits for the Locker.Close (what, in the messages) whose
// error closed carries, the member answering again, and fails the test
// unless it returned nil within 10 s.
func wantClosed(t *testing.T, closed <-chan error, what string) {
	t.Helper()
	select {
	case err := <-closed:
		t.Logf("%s = %v", what, err)
		if err != nil {
			t.Errorf("%s = %v, the member answering again", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still waiting 10 s after the member answered:\n%s", what, observetest.Stacks())
	}
}
