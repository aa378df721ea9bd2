package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	"github.com/fencekit/fence/internal/observetest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// heldCreate holds back the first create Txn (a Txn whose Then branch puts
// a key on an etcd lease) a client sends: the attempt times out on the
// caller's side without reaching etcd, as one sent to a member that hangs
// (SIGSTOPped, cut off) does, and the request is kept so that the test can
// deliver it later, as that member does when it comes back.
type heldCreate struct {
	mu  sync.Mutex
	req *pb.TxnRequest
}

func (h *heldCreate) client(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if tr, ok := req.(*pb.TxnRequest); ok && len(tr.Success) > 0 && tr.Success[0].GetRequestPut().GetLease() != 0 {
					h.mu.Lock()
					first := h.req == nil
					if first {
						h.req = tr
					}
					h.mu.Unlock()
					if first {
						<-ctx.Done()
						return ctx.Err()
					}
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})},
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// deliver sends the held create Txn to etcd through admin, late.
func (h *heldCreate) deliver(ctx context.Context, admin *clientv3.Client) (*pb.TxnResponse, error) {
	h.mu.Lock()
	req := h.req
	h.mu.Unlock()
	if req == nil {
		return nil, errors.New("no create Txn was held")
	}
	return pb.NewKVClient(admin.ActiveConnection()).Txn(ctx, req)
}

// An attempt of the create Txn that timed out may still be applied later
// (it sat in a member that hung, and Raft commits it when the member comes
// back). The key's Compare(CreateRevision = 0) then holds again once the
// lock was released, and the Put re-creates the key on the etcd lease.
// Without the spare pool that etcd lease was revoked and the Put fails; a
// kept etcd lease takes the key: an orphan that holds the lock for nobody
// while the Locker keeps reusing (and renewing) that etcd lease. So an etcd
// lease whose create Txn had an attempt time out is never kept.
func TestLateCreateAttemptNotOnSpare(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	var h heldCreate
	// A watchdog lease: its renewals make the etcd lease fresh again after
	// the attempt that timed out (a waiter's renewals would too).
	const ttl = 6 * time.Second
	l, err := etcdlock.New(h.client(t, endpoints), &etcdlock.Options{WatchdogTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	name := t.Name()
	a, err := l.Acquire(ctxFor(t, 20*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.deliver(ctxFor(t, 10*time.Second), admin); err != nil {
		t.Fatalf("the held create attempt while the lock is held: %v", err)
	}
	// Release right after a renewal, when the etcd lease is fresh.
	first := a.Deadline()
	for limit := time.Now().Add(2 * ttl); a.Deadline().Equal(first); {
		if time.Now().After(limit) {
			t.Fatal("no renewal")
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
	renewed := time.Now()
	if err := a.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if time.Since(renewed) > ttl/10 {
		t.Logf("Release took %v: the etcd lease was not fresh anyway", time.Since(renewed))
	}
	// The member comes back: the attempt is applied now.
	resp, err := h.deliver(ctxFor(t, 10*time.Second), admin)
	t.Logf("late create attempt: %v, %v; spares %x", resp, err, l.SpareIDs())
	other := newLocker(t, endpoints, nil)
	b, err := other.Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatalf("the lock, released, is held by nobody, yet Acquire = %v (a late create attempt put a key on the kept etcd lease %x; spares %x)", err, leaseID(t, a), l.SpareIDs())
	}
	if err := b.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A delete of the held key in the first watchDelay, before the watch has
// started: Done still comes, and a Release called at once gets
// ErrLeaseLost, deletes nothing (the next holder's key stays) and keeps no
// etcd lease.
func TestDeleteBeforeWatch(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, nil)
	for i := range 20 {
		name := fmt.Sprint(t.Name(), i)
		a, err := l.Acquire(ctxFor(t, 10*time.Second), name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Delete(ctxFor(t, 10*time.Second), a.(*etcdlock.Lease).Key()); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			waitDone(t, a, 5*time.Second)
		} else {
			b, err := newLocker(t, endpoints, nil).Acquire(ctxFor(t, 10*time.Second), name)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("Release after the key was deleted = %v, want ErrLeaseLost", err)
			}
			if n := countKeys(t, admin, l.Prefix(name)); n != 1 || b.Err() != nil {
				t.Fatalf("next holder after the old one's Release: %d keys, Err %v", n, b.Err())
			}
			if err := b.Release(ctxFor(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		if !errors.Is(a.Err(), fence.ErrLeaseLost) {
			t.Fatalf("Err = %v, want ErrLeaseLost", a.Err())
		}
		if slices.Contains(l.SpareIDs(), leaseID(t, a)) {
			t.Fatalf("the lost lease's etcd lease %x is kept", leaseID(t, a))
		}
	}
}

// Many goroutines acquiring and releasing through one Locker race for its
// spares, and Close for them too: no etcd lease may carry two locks at
// once, and none is revoked under a lock (each Release succeeds). Close
// closes the Locker (Acquire then fails with fence.ErrClosed, where each
// goroutine stops), and the locks released after it keep no spare.
func TestSpareRace(t *testing.T) {
	endpoints := shared.Endpoints()
	l := newLocker(t, endpoints, nil)
	var mu sync.Mutex
	using := map[clientv3.LeaseID]string{}
	var reused atomic.Int64
	firstReuse := make(chan struct{})
	var once sync.Once
	seen := sync.Map{}
	var wg sync.WaitGroup
	errs := make(chan error, 9)
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				name := fmt.Sprintf("%s-%d-%d", t.Name(), g, i%3)
				lease, err := l.Acquire(context.Background(), name, fence.Wait(10*time.Second))
				if errors.Is(err, fence.ErrClosed) {
					return
				}
				if err != nil {
					errs <- err
					return
				}
				id := leaseID(t, lease)
				if _, loaded := seen.LoadOrStore(id, true); loaded {
					reused.Add(1)
					once.Do(func() { close(firstReuse) })
				}
				mu.Lock()
				if other, ok := using[id]; ok {
					mu.Unlock()
					errs <- fmt.Errorf("etcd lease %x carries %s and %s at once", id, other, name)
					return
				}
				using[id] = name
				mu.Unlock()
				mu.Lock()
				delete(using, id)
				mu.Unlock()
				if err := lease.Release(context.Background()); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Close, called while the others acquire and release (once a spare
	// has been reused), revokes only spares nobody uses.
	allDone := make(chan struct{})
	closer := make(chan struct{})
	go func() {
		defer close(closer)
		select {
		case <-allDone:
		case <-firstReuse:
		}
		if err := l.Close(context.Background()); err != nil {
			errs <- err
		}
	}()
	wg.Wait()
	close(allDone)
	<-closer
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if reused.Load() == 0 {
		t.Error("no etcd lease was reused")
	}
	t.Logf("%d acquisitions on a reused etcd lease", reused.Load())
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ids := l.SpareIDs(); len(ids) != 0 {
		t.Errorf("spares kept after Close: %x", ids)
	}
}

// noRevokeClient is a client of endpoints whose LeaseRevoke calls fail
// without being sent while *off is true.
func noRevokeClient(t testing.TB, endpoints []string, off *atomic.Bool) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if off.Load() && strings.HasSuffix(method, "/LeaseRevoke") {
					return errors.New("revoke dropped by the test")
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})},
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A lock on a reused etcd lease claims no more than etcd gives: its
// deadline is measured from when the etcd lease's grant was sent, so the
// key, not renewed (a fixed fence.TTL, below etcd's minimum TTL and not a
// whole number of seconds), is deleted by etcd (the lock's own revoke at
// its deadline is dropped) no sooner than the lock's Deadline.
func TestSpareDeadlineWithinEtcdLease(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	var noRevoke atomic.Bool
	noRevoke.Store(true)
	l, err := etcdlock.New(noRevokeClient(t, endpoints, &noRevoke), nil)
	if err != nil {
		t.Fatal(err)
	}
	name := t.Name()
	for _, ttl := range []time.Duration{1200 * time.Millisecond, 2500 * time.Millisecond} {
		// The spare is fresh for a tenth of ttl: on a loaded machine the
		// cycle may take longer, so try again.
		var a, b fence.Lease
		var acquired time.Time
		for try := 0; ; try++ {
			var err error
			if a, err = l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(ttl)); err != nil {
				t.Fatal(err)
			}
			if err := a.Release(ctxFor(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			acquired = time.Now()
			if b, err = l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(ttl)); err != nil {
				t.Fatal(err)
			}
			if leaseID(t, b) == leaseID(t, a) {
				break
			}
			if try == 5 {
				t.Fatalf("TTL %v: not reused", ttl)
			}
			if err := b.Release(ctxFor(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		key := b.(*etcdlock.Lease).Key()
		wc := admin.Watch(ctxFor(t, 10*time.Second), key, clientv3.WithRev(int64(b.Token())+1), clientv3.WithFilterPut())
		var gone time.Time
		for wr := range wc {
			if len(wr.Events) > 0 {
				gone = time.Now()
				break
			}
			if wr.Err() != nil {
				t.Fatal(wr.Err())
			}
		}
		if gone.IsZero() || gone.Before(b.Deadline()) {
			t.Fatalf("TTL %v: etcd deleted the key at %v, before the lock's deadline %v", ttl, gone, b.Deadline())
		}
		t.Logf("TTL %v: key deleted %v after the lock's deadline; first lock's deadline %v before it, second lock acquired %v before it", ttl, gone.Sub(b.Deadline()), gone.Sub(a.Deadline()), gone.Sub(acquired))
		waitDone(t, b, 5*time.Second)
		if err := b.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release of the expired lock = %v", err)
		}
	}
	// A spare granted for one lease time is not used for another, though
	// etcd rounds both up to the same whole seconds.
	a, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(1100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(1900*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(context.Background())
	if leaseID(t, b) == leaseID(t, a) {
		t.Fatalf("a spare granted for 1.1 s used for a 1.9 s lock")
	}
}

// A leader change while the Locker keeps spares: the new leader extends
// every etcd lease, so a spare still fresh by the Locker's clock is still
// there (and one that is not, revoked or expired, costs a Grant); the
// locks taken hold, their Release keeps their etcd leases, and Close
// revokes them.
func TestSparesAcrossLeaderChange(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	endpoints := c.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, nil)
	const n = 4
	cycle := func() (ids []clientv3.LeaseID) {
		var leases []fence.Lease
		for i := range n {
			a, err := l.Acquire(ctxFor(t, 30*time.Second), fmt.Sprint(t.Name(), i))
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, a)
			ids = append(ids, leaseID(t, a))
		}
		if _, err := admin.Put(ctxFor(t, 20*time.Second), "barrier", ""); err != nil {
			t.Fatal(err)
		}
		for _, a := range leases {
			if a.Err() != nil {
				t.Fatalf("lock %q lost: %v", a.Name(), a.Err())
			}
			if err := a.Release(ctxFor(t, 30*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		return ids
	}
	before := cycle()
	old := etcdtest.Leader(t, c)
	old.Kill()
	leader := etcdtest.Leader(t, c, old)
	after := cycle()
	reused := 0
	for _, id := range after {
		if slices.Contains(before, id) {
			reused++
		}
	}
	t.Logf("leader %s killed, %s leads; %d of %d locks on a spare kept across it; spares %x", old.Name, leader.Name, reused, n, l.SpareIDs())
	kept := l.SpareIDs()
	if err := l.Close(ctxFor(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, id := range kept {
		ttl, err := admin.TimeToLive(ctxFor(t, 10*time.Second), id)
		if err != nil || ttl.TTL != -1 {
			t.Fatalf("spare %x after Close: %+v, %v; want it revoked", id, ttl, err)
		}
	}
	for i := range n {
		if k := countKeys(t, admin, l.Prefix(fmt.Sprint(t.Name(), i))); k != 0 {
			t.Fatalf("%d keys left", k)
		}
	}
}

// A Release that halts the watchdog while a renewal is in flight cancels
// that renewal: that is no failed renewal, and nothing is logged.
func TestReleaseDuringRenewalLogsNothing(t *testing.T) {
	endpoints := shared.Endpoints()
	var block atomic.Bool
	inFlight := make(chan struct{}, 1)
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(
			func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				if block.Load() && strings.HasSuffix(method, "/LeaseKeepAlive") {
					select {
					case inFlight <- struct{}{}:
					default:
					}
					<-ctx.Done()
					return nil, ctx.Err()
				}
				return streamer(ctx, desc, cc, method, opts...)
			})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	logs := &observetest.Logs{}
	l, err := etcdlock.New(c, &etcdlock.Options{WatchdogTTL: 3 * time.Second, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	a, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	block.Store(true)
	select {
	case <-inFlight:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal")
	}
	if err := a.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if lines := logs.All(); len(lines) != 0 {
		t.Fatalf("a Release during a renewal logged %v", lines)
	}
}

// A waiter on a spare: its create Txn reads the predecessor and it watches
// it at once; the holder's Release wakes it, and its etcd lease (the
// spare, renewed while it waited) is kept again at its own Release.
func TestWaiterOnSpare(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, &etcdlock.Options{WatchdogTTL: 3 * time.Second})
	name := t.Name()
	warm, err := l.Acquire(ctxFor(t, 10*time.Second), name+"-warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	holder, err := newLocker(t, endpoints, nil).Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan fence.Lease, 1)
	go func() {
		w, err := l.Acquire(ctxFor(t, 20*time.Second), name, fence.Wait(15*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	for limit := time.Now().Add(5 * time.Second); countKeys(t, admin, l.Prefix(name)) != 2; {
		if time.Now().After(limit) {
			t.Fatal("waiter not in line")
		}
	}
	// Hold until the waiter has renewed its etcd lease (every second): the
	// remaining TTL etcd reports goes up.
	id := clientv3.LeaseID(0)
	resp, err := admin.Get(ctxFor(t, 10*time.Second), l.Prefix(name), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if kv.CreateRevision != int64(holder.Token()) {
			id = clientv3.LeaseID(kv.Lease)
		}
	}
	low := int64(1 << 62)
	for limit := time.Now().Add(10 * time.Second); ; {
		ttl, err := admin.TimeToLive(ctxFor(t, 10*time.Second), id)
		if err != nil || ttl.TTL <= 0 {
			t.Fatalf("waiter's etcd lease %x: %+v, %v", id, ttl, err)
		}
		if ttl.TTL > low {
			break
		}
		low = min(low, ttl.TTL)
		if time.Now().After(limit) {
			t.Fatal("the waiter did not renew")
		}
	}
	released := time.Now()
	if err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	w := <-got
	if w == nil {
		t.FailNow()
	}
	t.Logf("waiter woken %v after the release; on the spare: %v", time.Since(released), leaseID(t, w) == leaseID(t, warm))
	if leaseID(t, w) != leaseID(t, warm) {
		t.Logf("the waiter did not use the spare (not fresh on this machine)")
	}
	if w.Token() <= holder.Token() {
		t.Fatalf("token %d after %d", w.Token(), holder.Token())
	}
	ttl, err := admin.TimeToLive(ctxFor(t, 10*time.Second), leaseID(t, w))
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("waiter's etcd lease: %+v, %v", ttl, err)
	}
	if left := time.Until(w.Deadline()); left > time.Duration(ttl.TTL+1)*time.Second || left <= 0 {
		t.Fatalf("deadline %v away, etcd lease %d s left", left, ttl.TTL)
	}
	if err := w.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}
