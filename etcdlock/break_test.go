package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// txnHook is called, when set, after each Txn or DeleteRange (Release's
// delete) the hooked client sends,
// with the invoker's error; it returns the error the caller gets.
type txnHook struct {
	f atomic.Pointer[func(error) error]
}

func (h *txnHook) set(f func(error) error) { h.f.Store(&f) }

// hookedClient is a client of endpoints whose Txn and DeleteRange replies
// go through h.
func hookedClient(t testing.TB, endpoints []string, h *txnHook) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if f := h.f.Load(); f != nil && (strings.HasSuffix(method, "/Txn") || strings.HasSuffix(method, "/DeleteRange")) {
					return (*f)(err)
				}
				return err
			})},
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// An Extend whose Txn moved the key to the new etcd lease but whose reply
// was lost (the caller's ctx ended, the connection dropped) must not revoke
// that new etcd lease: it now carries the key, and revoking it deletes the
// lock the caller still holds.
func TestExtendReplyLostKeepsLock(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	var h txnHook
	l, err := etcdlock.New(hookedClient(t, endpoints, &h), nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	var once atomic.Bool
	h.set(func(err error) error {
		if err == nil && once.CompareAndSwap(false, true) {
			return context.DeadlineExceeded // applied, reply lost
		}
		return err
	})
	err = lease.Extend(ctxFor(t, 10*time.Second), time.Minute)
	h.set(func(err error) error { return err })
	t.Logf("Extend with its reply lost = %v", err)
	key := lease.(*etcdlock.Lease).Key()
	resp, gerr := admin.Get(ctxFor(t, 10*time.Second), key)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("Extend whose reply was lost deleted the lock's key (lease Err %v)", lease.Err())
	}
	if lease.Err() != nil {
		t.Fatalf("lease ended: %v", lease.Err())
	}
	// Whatever Extend said, the key's etcd lease is the one renewed and
	// revoked by the lease: Release leaves nothing behind.
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, admin, l.Prefix(t.Name())); n != 0 {
		t.Fatalf("%d keys left after Release", n)
	}
}

// An Extend still in flight when the lease reaches its deadline must not
// report success for the lease that has ended, nor leave the key on the new
// etcd lease, blocking the lock for the new TTL.
func TestExtendRacingDeadline(t *testing.T) {
	endpoints := shared.Endpoints()
	var h txnHook
	l, err := etcdlock.New(hookedClient(t, endpoints, &h), nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	// The Extend's Txn is answered only once the lease has ended at its
	// deadline: the reply was slow.
	h.set(func(err error) error {
		select {
		case <-lease.Done():
		case <-time.After(10 * time.Second):
		}
		return err
	})
	err = lease.Extend(ctxFor(t, 20*time.Second), time.Minute)
	h.set(func(err error) error { return err })
	if lease.Err() == nil {
		t.Fatal("lease did not end at its deadline")
	}
	if err == nil {
		t.Errorf("Extend = nil for a lease that ended meanwhile (Err %v)", lease.Err())
	} else if !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Extend = %v, want ErrLeaseLost", err)
	}
	// The lock is free: nobody holds the key.
	other, err := newLocker(t, endpoints, nil).Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.Wait(2*time.Second))
	if err != nil {
		t.Fatalf("the lock is still held after its lease ended: %v", err)
	}
	if err := other.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A user who closes the client while a lease is held: the lease ends at
// once (nothing can renew it or watch its key any more), without a panic,
// and Release reports it lost.
func TestClientClosedWhileHeld(t *testing.T) {
	endpoints := shared.Endpoints()
	name := freshName(t)
	c := newClient(t, endpoints, nil)
	l, err := etcdlock.New(c, nil) // watchdog: 30 s
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	took := waitDone(t, lease, 5*time.Second)
	t.Logf("lease ended %v after the client was closed: %v", took, lease.Err())
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", lease.Err())
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
	if _, err := l.Acquire(ctxFor(t, 10*time.Second), name); !errors.Is(err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire on a closed client = %v, want ErrNotAcquired", err)
	}
}

func countKeys(t testing.TB, c *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := c.Get(ctxFor(t, 10*time.Second), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// A waiter whose client the user closes gives up at once with an error,
// and is not granted the lock.
func TestClientClosedWhileWaiting(t *testing.T) {
	endpoints := shared.Endpoints()
	name := freshName(t)
	holder, err := newLocker(t, endpoints, nil).Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	c := newClient(t, endpoints, nil)
	l, err := etcdlock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctxFor(t, 30*time.Second), name, fence.Wait(20*time.Second))
		errc <- err
	}()
	admin := newClient(t, endpoints, nil)
	for end := time.Now().Add(10 * time.Second); countKeys(t, admin, l.Prefix(name)) < 2; {
		if time.Now().After(end) {
			t.Fatal("no waiter's key after 10 s")
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		t.Logf("waiter on a closed client: %v", err)
		if !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("waiter on a closed client = %v, want ErrNotAcquired", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter on a closed client still waiting after 5 s")
	}
}

// An Acquire whose ctx ends right after each of its calls reached etcd
// (the reply lost with it) leaves no key behind, and no etcd lease but,
// at most, the one whose Grant reply was lost (it holds no key and
// expires on its own).
func TestAcquireCancelledAtEachStep(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	holder, err := newLocker(t, endpoints, nil).Acquire(ctxFor(t, 10*time.Second), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())

	var calls, cancelAt atomic.Int64
	var cancelCall atomic.Pointer[context.CancelFunc]
	c, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if strings.HasSuffix(method, "/Txn") || strings.HasSuffix(method, "/LeaseGrant") {
					if calls.Add(1) == cancelAt.Load() {
						(*cancelCall.Load())()
						return context.Canceled
					}
				}
				return err
			})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	l, err := etcdlock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	leases := func() map[clientv3.LeaseID]bool {
		resp, err := admin.Leases(ctxFor(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		m := map[clientv3.LeaseID]bool{}
		for _, s := range resp.Leases {
			m[s.ID] = true
		}
		return m
	}
	// First without cancelling: count the calls (Grant, the create Txn,
	// the waiter's checks) of an Acquire that waits out its budget.
	calls.Store(0)
	if _, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.Wait(time.Second)); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire = %v, want ErrHeld", err)
	}
	total := calls.Load()
	for step := int64(1); step <= total; step++ {
		before := leases()
		calls.Store(0)
		cancelAt.Store(step)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cancelCall.Store(&cancel)
		_, err := l.Acquire(ctx, t.Name(), fence.Wait(time.Second))
		cancel()
		made := calls.Load()
		if !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("step %d: Acquire = %v, want ErrNotAcquired", step, err)
		}
		if n := countKeys(t, admin, l.Prefix(t.Name())); n != 1 {
			t.Errorf("step %d: %d keys under the lock, want the holder's only", step, n)
		}
		var leaked []clientv3.LeaseID
		for id := range leases() {
			if !before[id] {
				leaked = append(leaked, id)
			}
		}
		t.Logf("step %d of %d (%d made): %v; new etcd leases left: %d", step, total, made, err, len(leaked))
		if step > 1 && len(leaked) > 0 {
			t.Errorf("step %d: etcd leases left: %v", step, leaked)
		}
	}
}

// Lock names that are prefixes of each other, or carry the escape
// character, '/', unicode or spaces, are distinct locks: all are held at
// once, and releasing one leaves the others' keys alone.
func TestNamesDistinct(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, nil)
	base := t.Name()
	names := []string{base, base + "/", base + "/b", base + "%2Fb", base + "%252Fb", base + "b",
		base + "/b/c", base + "%", base + " ü/☃"}
	var leases []fence.Lease
	for _, n := range names {
		ls, err := l.Acquire(ctxFor(t, 10*time.Second), n)
		if err != nil {
			t.Fatalf("Acquire(%q) with %d others held: %v", n, len(leases), err)
		}
		leases = append(leases, ls)
	}
	for i := range leases {
		if n := countKeys(t, admin, l.Prefix(names[i])); n != 1 {
			t.Errorf("%q: %d keys under its prefix, want 1", names[i], n)
		}
	}
	if err := leases[0].Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, ls := range leases[1:] {
		if ls.Err() != nil {
			t.Errorf("%q ended when %q was released: %v", ls.Name(), names[0], ls.Err())
		}
		if err := ls.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Errorf("Release(%q) = %v", ls.Name(), err)
		}
	}
}

// A waiter whose predecessor is a waiter that gives up checks again: it
// does not take the departure for a release while the holder still holds.
func TestPredecessorWaiterGivesUp(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	name := t.Name()
	holder, err := newLocker(t, endpoints, nil).Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	var kv atomic.Int64
	l, err := etcdlock.New(newClient(t, endpoints, &kv), nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	go func() { _, err := l.Acquire(ctx1, name, fence.Wait(time.Minute)); first <- err }()
	for end := time.Now().Add(10 * time.Second); countKeys(t, admin, l.Prefix(name)) < 2; {
		if time.Now().After(end) {
			t.Fatal("no first waiter after 10 s")
		}
	}
	type result struct {
		lease fence.Lease
		err   error
	}
	second := make(chan result, 1)
	go func() {
		ls, err := l.Acquire(ctxFor(t, time.Minute), name, fence.Wait(time.Minute))
		second <- result{ls, err}
	}()
	for end := time.Now().Add(10 * time.Second); countKeys(t, admin, l.Prefix(name)) < 3; {
		if time.Now().After(end) {
			t.Fatal("no second waiter after 10 s")
		}
	}
	calls := kv.Load()
	cancel1()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first waiter = %v, want context.Canceled", err)
	}
	// The second waiter sees its predecessor go and checks again (a KV
	// call); it must still wait. Give it the time of a few round trips
	// after that to be wrongly granted. The first waiter's key goes with
	// its etcd lease: revoked as it gives up, or, if that revoke did not
	// get through within cleanupTimeout (seen once under make test's
	// load), when the lease expires, within the watchdog TTL (30 s).
	for end := time.Now().Add(40 * time.Second); kv.Load() == calls; {
		if time.Now().After(end) {
			t.Fatal("the second waiter did not check again after 40 s")
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
	select {
	case r := <-second:
		t.Fatalf("second waiter granted while the holder holds: %v, %v", r.lease, r.err)
	case <-time.After(time.Second):
	}
	if n := countKeys(t, admin, l.Prefix(name)); n != 2 {
		t.Fatalf("%d keys, want the holder's and the second waiter's", n)
	}
	if err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := <-second
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.lease.Token() <= holder.Token() {
		t.Fatalf("token %d after %d", r.lease.Token(), holder.Token())
	}
	if err := r.lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A waiter whose check (a Range) and watch of its predecessor are split
// by a compaction, as auto-compaction may on a busy cluster, checks again
// rather than fail; granted, its lease notices its key's deletion although
// the history since the token is compacted (its watch from the token is
// refused), and IsOwner fails once the lease is lost.
func TestCompactionWhileWaiting(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	name := t.Name()
	holder, err := newLocker(t, endpoints, nil).Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	var h txnHook
	l, err := etcdlock.New(hookedClient(t, endpoints, &h), &etcdlock.Options{WatchdogTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// The waiter's second Txn is its first check: before its reply comes,
	// other writes happen and the history is compacted past it.
	var txns atomic.Int64
	compacted := make(chan error, 1)
	h.set(func(err error) error {
		if txns.Add(1) != 2 {
			return err
		}
		var rev int64
		for i := range 10 {
			resp, err := admin.Put(context.Background(), name+"/other", strings.Repeat("x", i))
			if err != nil {
				compacted <- err
				return err
			}
			rev = resp.Header.Revision
		}
		_, cerr := admin.Compact(context.Background(), rev, clientv3.WithCompactPhysical())
		compacted <- cerr
		return err
	})
	type result struct {
		lease fence.Lease
		err   error
	}
	waiter := make(chan result, 1)
	go func() {
		ls, err := l.Acquire(ctxFor(t, time.Minute), name, fence.Wait(time.Minute))
		waiter <- result{ls, err}
	}()
	if err := <-compacted; err != nil {
		t.Fatal(err)
	}
	// Let the waiter make its next check before the release: it must
	// still be waiting.
	for end := time.Now().Add(10 * time.Second); txns.Load() < 3; {
		select {
		case r := <-waiter:
			t.Fatalf("waiter returned after a compaction while the lock is held: %v, %v", r.lease, r.err)
		default:
		}
		if time.Now().After(end) {
			t.Fatal("the waiter did not check again after 10 s")
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
	if err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := <-waiter
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.lease.Token() <= holder.Token() {
		t.Fatalf("token %d after %d", r.lease.Token(), holder.Token())
	}
	cmp, err := etcdlock.IsOwner(r.lease)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := admin.Txn(ctxFor(t, 10*time.Second)).If(cmp).Commit(); err != nil || !resp.Succeeded {
		t.Fatalf("IsOwner Txn while held: %v, %v", resp, err)
	}
	removeHolder(t, admin, name)
	waitDone(t, r.lease, 5*time.Second)
	if resp, err := admin.Txn(ctxFor(t, 10*time.Second)).If(cmp).Commit(); err != nil || resp.Succeeded {
		t.Fatalf("IsOwner Txn after the lease was lost: %v, %v", resp, err)
	}
	if err := r.lease.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
}

// A holder that releases while the next waiter is between its check (the
// create Txn, which reads the key before the waiter's) and its watch: the
// watch starts from the check's revision, so the
// waiter sees the delete at once rather than at its next renewal (a third
// of the 30 s watchdog TTL).
func TestReleaseBetweenCheckAndWatch(t *testing.T) {
	endpoints := shared.Endpoints()
	name := t.Name()
	holder, err := newLocker(t, endpoints, nil).Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	var h txnHook
	l, err := etcdlock.New(hookedClient(t, endpoints, &h), nil)
	if err != nil {
		t.Fatal(err)
	}
	var txns atomic.Int64
	h.set(func(err error) error {
		if txns.Add(1) == 1 { // the create Txn, the waiter's first check
			if rerr := holder.Release(context.Background()); rerr != nil {
				t.Error(rerr)
			}
		}
		return err
	})
	start := time.Now()
	lease, err := l.Acquire(ctxFor(t, time.Minute), name, fence.Wait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("granted %v after the call", took)
	if took > 5*time.Second {
		t.Fatalf("granted %v after a release between its check and its watch", took)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// 50 goroutines on four clients take and release one lock: never two
// holders at once, and tokens strictly increase in the order of the grants.
func TestManyContenders(t *testing.T) {
	endpoints := shared.Endpoints()
	var lockers []*etcdlock.Locker
	for range 4 {
		lockers = append(lockers, newLocker(t, endpoints, nil))
	}
	ctx := ctxFor(t, 2*time.Minute)
	const n = 50
	var (
		holding atomic.Int64
		mu      sync.Mutex
		tokens  []fence.Token
		wg      sync.WaitGroup
		errs    = make(chan error, n)
	)
	for i := range n {
		wg.Go(func() {
			lease, err := lockers[i%len(lockers)].Acquire(ctx, t.Name(), fence.Wait(time.Minute))
			if err != nil {
				errs <- err
				return
			}
			if h := holding.Add(1); h != 1 {
				errs <- errors.New("two holders at once")
			}
			mu.Lock()
			tokens = append(tokens, lease.Token())
			mu.Unlock()
			holding.Add(-1)
			if err := lease.Release(ctx); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(tokens) != n {
		t.Fatalf("%d grants, want %d", len(tokens), n)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d: token %d after %d", i, tokens[i], tokens[i-1])
		}
	}
}

// With the only member paused, an Extend hangs on it (its ctx has no
// deadline); a Release given a deadline meanwhile must return by that
// deadline, not wait for the Extend.
func TestReleaseWhileExtendHangs(t *testing.T) {
	c := etcdtest.Start(t)
	m := c.Members[0]
	// granting is closed when the Extend's Grant is sent (it holds the
	// lease's lock by then).
	granting := make(chan struct{})
	var armed atomic.Bool
	client, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if strings.HasSuffix(method, "/LeaseGrant") && armed.CompareAndSwap(true, false) {
					close(granting)
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	l, err := etcdlock.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m.Stop()
	armed.Store(true)
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(context.Background(), time.Minute) }()
	defer func() {
		m.Cont()
		select {
		case err := <-extended:
			t.Logf("Extend = %v", err)
		case <-time.After(20 * time.Second):
			t.Error("Extend still hung 20 s after the member resumed")
		}
	}()
	select {
	case err := <-extended:
		t.Fatalf("Extend returned with the member paused: %v", err)
	case <-granting:
	}
	start := time.Now()
	released := make(chan error, 1)
	go func() { released <- lease.Release(ctxFor(t, 2*time.Second)) }()
	select {
	case err := <-released:
		t.Logf("Release = %v after %v", err, time.Since(start))
		if err == nil {
			t.Fatal("Release succeeded with the member paused")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Release with a 2 s deadline still blocked after 5 s behind a hung Extend")
	}
}

// An Extend given no deadline, with the only member paused, gives up by
// the lease's own deadline: past it the lease has ended anyway, and the
// caller must not hang on a member that may never answer.
func TestExtendBoundedByLeaseDeadline(t *testing.T) {
	c := etcdtest.Start(t)
	m := c.Members[0]
	l := newLocker(t, c.Endpoints(), nil)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m.Stop()
	t.Cleanup(m.Cont)
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(context.Background(), time.Minute) }()
	limit := time.Until(lease.Deadline()) + 2*time.Second
	select {
	case err := <-extended:
		t.Logf("Extend = %v, %v after the deadline", err, time.Since(lease.Deadline()))
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Extend = %v, want ErrLeaseLost", err)
		}
	case <-time.After(limit):
		m.Cont()
		<-extended
		t.Fatalf("Extend still waiting on the paused member %v after the lease's deadline", time.Since(lease.Deadline()))
	}
}

// A waiter with a short lease time (fence.TTL(30ms): etcd grants its
// minimum, a second or more) renews its etcd lease, and so checks its
// place again, on etcd's granted TTL, not every 10 ms.
func TestShortTTLWaiterDoesNotSpin(t *testing.T) {
	endpoints := shared.Endpoints()
	holder, err := newLocker(t, endpoints, nil).Acquire(ctxFor(t, 10*time.Second), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	var kv atomic.Int64
	l, err := etcdlock.New(newClient(t, endpoints, &kv), nil)
	if err != nil {
		t.Fatal(err)
	}
	const wait = 2 * time.Second
	_, err = l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(30*time.Millisecond), fence.Wait(wait))
	if !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire = %v, want ErrHeld", err)
	}
	t.Logf("%d KV calls in a wait of %v", kv.Load(), wait)
	if n := kv.Load(); n > 10 {
		t.Fatalf("%d KV calls in a wait of %v, want a handful", n, wait)
	}
}

// Release of a lease already lost is conclusive even with an ended ctx:
// it sends nothing, so it needs no ctx (a deferred Release after the
// caller's deadline).
func TestReleaseLostWithEndedCtx(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, &etcdlock.Options{WatchdogTTL: 3 * time.Second})
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for round := range 10 {
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Revoke(ctxFor(t, 10*time.Second), leaseID(t, lease)); err != nil {
			t.Fatal(err)
		}
		waitDone(t, lease, 5*time.Second)
		if err := lease.Release(ended); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("round %d: Release of a lost lease with an ended ctx = %v, want ErrLeaseLost", round, err)
		}
	}
}

// lateTxn is a client interceptor that, once armed, holds back the next
// Txn (its caller gets DeadlineExceeded, as if the reply were lost on a
// slow member) and sends it once the next KV call after it has been
// answered: a request still on its way, arriving after its sender looked
// at the key.
type lateTxn struct {
	armed    atomic.Bool
	mu       sync.Mutex
	replay   func() error // the held Txn, sent by the next KV call
	replayed chan error
}

func (h *lateTxn) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !strings.HasPrefix(method, "/etcdserverpb.KV/") {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if strings.HasSuffix(method, "/Txn") && h.armed.CompareAndSwap(true, false) {
		h.mu.Lock()
		h.replay = func() error {
			return invoker(context.Background(), method, req, new(pb.TxnResponse), cc, opts...)
		}
		h.mu.Unlock()
		return context.DeadlineExceeded
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	h.mu.Lock()
	replay := h.replay
	h.replay = nil
	h.mu.Unlock()
	if replay != nil {
		h.replayed <- replay()
	}
	return err
}

// An Extend whose move Txn got no answer, and arrives only after the
// Extend looked at the key and found it still on its old etcd lease: the
// Extend then revoked the etcd lease it had granted, which the late Txn
// had just put the key on, and the lock was deleted under its holder, who
// learned of it only from its watch (another Acquire could take the lock
// meanwhile). Now the late Txn finds the key changed and does nothing.
func TestLateExtendTxnKeepsLock(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	h := &lateTxn{replayed: make(chan error, 1)}
	c, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(h.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	l, err := etcdlock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	h.armed.Store(true)
	err = lease.Extend(ctxFor(t, 10*time.Second), time.Minute)
	t.Logf("Extend with its Txn late = %v", err)
	select {
	case rerr := <-h.replayed:
		t.Logf("the late Txn: %v", rerr)
	case <-time.After(10 * time.Second):
		t.Fatal("the Extend's Txn was never sent late")
	}
	key := lease.(*etcdlock.Lease).Key()
	resp, gerr := admin.Get(ctxFor(t, 10*time.Second), key)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("the lock's key was deleted under its holder (Extend = %v, lease Err %v)", err, lease.Err())
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("the lease ended with its key in place: %v", err)
	}
	// The key is on the etcd lease that the Lease renews: it outlives a
	// renewal period.
	ttl, lerr := admin.TimeToLive(ctxFor(t, 10*time.Second), clientv3.LeaseID(resp.Kvs[0].Lease))
	if lerr != nil || ttl.TTL <= 0 {
		t.Fatalf("the key's etcd lease %x: TTL %v, %v", resp.Kvs[0].Lease, ttl, lerr)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, admin, l.Prefix(t.Name())); n != 0 {
		t.Fatalf("%d keys left after Release", n)
	}
}
