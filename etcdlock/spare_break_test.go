package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
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
// spares: no etcd lease may carry two locks at once.
func TestSpareRace(t *testing.T) {
	endpoints := shared.Endpoints()
	l := newLocker(t, endpoints, nil)
	var mu sync.Mutex
	using := map[clientv3.LeaseID]string{}
	var reused atomic.Int64
	seen := sync.Map{}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				name := fmt.Sprintf("%s-%d-%d", t.Name(), g, i%3)
				lease, err := l.Acquire(context.Background(), name, fence.Wait(10*time.Second))
				if err != nil {
					errs <- err
					return
				}
				id := leaseID(t, lease)
				if _, loaded := seen.LoadOrStore(id, true); loaded {
					reused.Add(1)
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
	wg.Wait()
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
}
