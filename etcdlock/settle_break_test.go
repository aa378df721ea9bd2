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
	"github.com/fencekit/fence/internal/observetest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// txnScript is a client interceptor that, once a step is set, hands it
// each Txn the client sends, numbered from 0: send sends it with the
// given ctx into the caller's reply; late sends it later, after its
// caller returned, and is what a step keeps to replay a Txn held back.
type txnScript struct {
	mu   sync.Mutex
	step func(n int, ctx context.Context, send func(context.Context) error, late func() error) error
	n    int
	held []func() error // Txns held back by hold, to be sent late
}

func (s *txnScript) set(step func(n int, ctx context.Context, send func(context.Context) error, late func() error) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.step, s.n = step, 0
}

func (s *txnScript) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !strings.HasSuffix(method, "/Txn") {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	s.mu.Lock()
	step, n := s.step, s.n
	if step != nil {
		s.n++
	}
	s.mu.Unlock()
	if step == nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	return step(n, ctx,
		func(ctx context.Context) error { return invoker(ctx, method, req, reply, cc, opts...) },
		func() error { return invoker(context.Background(), method, req, new(pb.TxnResponse), cc, opts...) })
}

// hold holds the Txn back until its attempt is cut (a member that hangs
// on it), keeps it to be sent late, and fails as the cut attempt does.
func (s *txnScript) hold(ctx context.Context, late func() error) error {
	<-ctx.Done()
	s.mu.Lock()
	s.held = append(s.held, late)
	s.mu.Unlock()
	return ctx.Err()
}

// sendHeld sends the Txns held back, in order, and returns their errors.
func (s *txnScript) sendHeld() []error {
	s.mu.Lock()
	held := s.held
	s.held = nil
	s.mu.Unlock()
	var errs []error
	for _, late := range held {
		errs = append(errs, late())
	}
	return errs
}

func scriptedLocker(t testing.TB, s *txnScript, o *etcdlock.Options) *etcdlock.Locker {
	t.Helper()
	return scriptedLockerOf(t, shared.Endpoints(), s, o)
}

func scriptedLockerOf(t testing.TB, endpoints []string, s *txnScript, o *etcdlock.Options) *etcdlock.Locker {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(s.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	l, err := etcdlock.New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// scriptedLease acquires t.Name() for ttl on a Locker whose Txns go
// through s, and returns the Locker, the lease, released in t.Cleanup,
// and the etcd lease its key was created on.
func scriptedLease(t *testing.T, s *txnScript, ttl time.Duration) (*etcdlock.Locker, fence.Lease, clientv3.LeaseID) {
	t.Helper()
	l := scriptedLocker(t, s, nil)
	lease := acquire(t, l, t.Name(), ttl)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	return l, lease, leaseID(t, lease)
}

// keyOn returns the etcd lease and mod revision of lease's key, failing
// the test if it is gone or is not the one created at the token.
func keyOn(t testing.TB, admin *clientv3.Client, lease fence.Lease) (clientv3.LeaseID, int64) {
	t.Helper()
	resp, err := admin.Get(ctxFor(t, 10*time.Second), lease.(*etcdlock.Lease).Key())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("the key of lease %d is gone (lease Err %v)", lease.Token(), lease.Err())
	}
	if kv := resp.Kvs[0]; kv.CreateRevision != int64(lease.Token()) {
		t.Fatalf("the key was created at %d, want the token %d", kv.CreateRevision, lease.Token())
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease), resp.Kvs[0].ModRevision
}

// triedBefore reports whether an attempt on actx is one of the tries an
// Extend makes on a ctx that ends at end, its own: they carry that
// deadline, and its settle's attempts, sent after end, later ones. The
// move is sent again after Unavailable until end, so a script that wants
// the settle to run refuses all of them.
func triedBefore(actx context.Context, end time.Time) bool {
	dl, ok := actx.Deadline()
	return ok && !dl.After(end)
}

// An Extend whose move Txn fails with a passing error (a member without a
// leader, as a caller's clientv3.WithRequireLeader gets at once during an
// election) until its ctx ends, and whose settling Txn gets that error too
// the first time: the settle gave up on that one error and ended a lease
// whose key sat untouched on its renewed etcd lease, and revoked it, which
// deleted the lock under its holder. It must try again (within its grace
// past the Extend's ctx), and the lease goes on.
func TestExtendSettleRetriesPassingError(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	rec := &observetest.Recorder{}
	l := scriptedLocker(t, s, &etcdlock.Options{Observer: rec})
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	old := leaseID(t, lease)
	ectx := ctxFor(t, 500*time.Millisecond)
	end, _ := ectx.Deadline()
	settles := 0
	s.set(func(n int, ctx context.Context, send func(context.Context) error, _ func() error) error {
		if triedBefore(ctx, end) {
			return rpctypes.ErrGRPCNoLeader // the move
		}
		if settles++; settles == 1 { // the first settling Txn: not sent
			return rpctypes.ErrGRPCNoLeader
		}
		return send(ctx)
	})
	err = lease.Extend(ectx, time.Minute)
	s.set(nil)
	t.Logf("Extend with no leader for its move and its first settling Txn = %v", err)
	if err == nil || errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend = %v, want the move's error, the lease held", err)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("the lease ended although its key was in place: %v", err)
	}
	if id, _ := keyOn(t, admin, lease); id != old {
		t.Fatalf("the key is on etcd lease %x, want the old one %x", int64(id), int64(old))
	}
	if err := lease.Extend(ctxFor(t, 10*time.Second), time.Minute); err != nil {
		t.Fatalf("Extend with the cluster answering: %v", err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if ends := rec.WaitEnds(t, 1, 5*time.Second); len(ends) != 1 || ends[0].Cause != fence.Released {
		t.Fatalf("LeaseEnded %+v, want one, released", ends)
	}
	if n := countKeys(t, admin, l.Prefix(t.Name())); n != 0 {
		t.Fatalf("%d keys left after Release", n)
	}
}

// Several move attempts of one Extend held back on a member that hangs,
// each cut by its timeout, then the caller's ctx ends: the settle moves
// the key back onto its etcd lease, and the held Txns, all sent late,
// none of them applies: the key stays where the settle put it, and the
// lease can be extended and released as usual.
func TestExtendManyLateMovesSettled(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	const ttl = 6 * time.Second // an attempt gets a second
	l, lease, old := scriptedLease(t, s, ttl)
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	s.set(func(n int, actx context.Context, send func(context.Context) error, late func() error) error {
		// The moves are held back while the caller's ctx lasts; the Txns
		// after it are the settle's.
		if ctx.Err() == nil {
			return s.hold(actx, late)
		}
		return send(actx)
	})
	err := lease.Extend(ctx, time.Minute)
	s.set(nil)
	s.mu.Lock()
	moves := len(s.held)
	s.mu.Unlock()
	if moves < 2 {
		t.Fatalf("%d move attempts held back, want several", moves)
	}
	t.Logf("Extend with its moves held back = %v", err)
	if err == nil || errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend = %v, want its ctx's error, the lease held", err)
	}
	waitSettled(t, l, 5*time.Second) // on a loaded machine, past doneGrace
	id, rev := keyOn(t, admin, lease)
	if id != old {
		t.Fatalf("the key is on etcd lease %x, want the old one %x", int64(id), int64(old))
	}
	for i, err := range s.sendHeld() {
		t.Logf("late move %d: %v", i, err)
	}
	if id2, rev2 := keyOn(t, admin, lease); id2 != old || rev2 != rev {
		t.Fatalf("after the late moves the key is on %x at %d, want %x at %d", int64(id2), rev2, int64(old), rev)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("lease ended: %v", err)
	}
	if err := lease.Extend(ctxFor(t, 10*time.Second), time.Minute); err != nil {
		t.Fatalf("Extend after the settled one: %v", err)
	}
	if id, _ := keyOn(t, admin, lease); id == old {
		t.Fatalf("the key is still on the old etcd lease %x after an Extend", int64(old))
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, admin, l.Prefix(t.Name())); n != 0 {
		t.Fatalf("%d keys left after Release", n)
	}
}

// An Extend whose move and settling Txns all go unanswered (held back on
// a member that hangs), with the caller's ctx short: Extend returns by its
// ctx's deadline and doneGrace, with ctx's error, the settle going on in
// the background; then the lease ends, lost, once (one LeaseEnded), both
// etcd leases are revoked so that the lock is free at once, and the held
// Txns, sent late, put nothing back: another holder's lock and keys are
// left alone.
func TestExtendUnsettledEndsLeaseOnce(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	rec := &observetest.Recorder{}
	l := scriptedLocker(t, s, &etcdlock.Options{Observer: rec})
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s.set(func(n int, ctx context.Context, send func(context.Context) error, late func() error) error {
		return s.hold(ctx, late)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = lease.Extend(ctx, time.Minute)
	took := time.Since(start)
	t.Logf("Extend with nothing answered = %v after %v", err, took)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend = %v, want ctx's error, not lost while the move is settled", err)
	}
	if took > 300*time.Millisecond+extendGrace {
		t.Fatalf("Extend took %v with its ctx done after 300ms", took)
	}
	waitDone(t, lease, 5*time.Second)
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("lease Err = %v once the settle gave up, want ErrLeaseLost", lease.Err())
	}
	waitSettled(t, l, 5*time.Second)
	s.set(nil)
	if n := countKeys(t, admin, l.Prefix(t.Name())); n != 0 {
		t.Fatalf("%d keys left once the lease ended: its etcd leases were not revoked", n)
	}
	other := newLocker(t, shared.Endpoints(), nil)
	next, err := other.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(20*time.Second), fence.Wait(0))
	if err != nil {
		t.Fatalf("Acquire after the lease ended: %v", err)
	}
	for i, err := range s.sendHeld() {
		t.Logf("late Txn %d: %v", i, err)
	}
	if n := countKeys(t, admin, l.Prefix(t.Name())); n != 1 {
		t.Fatalf("%d keys after the late Txns, want the next holder's alone", n)
	}
	if id, _ := keyOn(t, admin, next); id != leaseID(t, next) {
		t.Fatalf("the next holder's key moved to %x", int64(id))
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of the lost lease = %v, want ErrLeaseLost", err)
	}
	if err := next.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	ends := rec.WaitEnds(t, 1, 5*time.Second)
	if len(ends) != 1 || ends[0].Cause == fence.Released || ends[0].Token != lease.Token() {
		t.Fatalf("LeaseEnded %+v, want one, lost", ends)
	}
}

// A lease whose create Txn timed out but was applied (its reply lost),
// found by the retry in its Else branch, and granted after waiting in
// line: its mod revision is the key's, so its Extend moves the key; a
// wrong one would fail every Extend of a healthy lease.
func TestExtendAfterCreateRetriedAndWait(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	holder, err := newLocker(t, shared.Endpoints(), nil).Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s := &txnScript{}
	l := scriptedLocker(t, s, nil)
	var applied atomic.Bool
	s.set(func(n int, ctx context.Context, send func(context.Context) error, _ func() error) error {
		if n == 0 { // the create: applied, its reply lost past its timeout
			<-ctx.Done()
			if err := send(context.WithoutCancel(ctx)); err != nil {
				return err
			}
			applied.Store(true)
			return ctx.Err()
		}
		return send(ctx)
	})
	type result struct {
		lease fence.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctxFor(t, 30*time.Second), t.Name(), fence.TTL(3*time.Second), fence.Wait(20*time.Second))
		got <- result{lease, err}
	}()
	for limit := time.Now().Add(10 * time.Second); countKeys(t, admin, l.Prefix(t.Name())) != 2; {
		if time.Now().After(limit) {
			t.Fatal("the waiter's key did not appear")
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	if err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := <-got
	s.set(nil)
	if r.err != nil {
		t.Fatal(r.err)
	}
	lease := r.lease
	defer lease.Release(context.Background())
	if !applied.Load() {
		t.Fatal("the create Txn was not applied with its reply lost")
	}
	_, rev := keyOn(t, admin, lease)
	if rev != int64(lease.Token()) {
		t.Fatalf("the key's mod revision %d, its create revision %d", rev, lease.Token())
	}
	if err := lease.Extend(ctxFor(t, 10*time.Second), time.Minute); err != nil {
		t.Fatalf("Extend of a lease whose create was retried, granted after waiting: %v", err)
	}
	if err := lease.Extend(ctxFor(t, 10*time.Second), time.Minute); err != nil {
		t.Fatalf("second Extend: %v", err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// While the cluster answers every Txn with an error (no leader), the
// move, then the settle, try again while the Extend's ctx lasts; a
// Release given a deadline meanwhile returns by it and ends the lease, and
// then they stop at once, rather than trying until the lease's deadline:
// the Extend returns, and both etcd leases are revoked (the key is gone).
// (With the move tried again after Unavailable, it went on until the
// lease's deadline, 30 s: "the Extend went on settling after the lease
// ended".)
func TestReleaseStopsSettle(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	l := scriptedLocker(t, s, nil)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	settling := make(chan struct{})
	var once sync.Once
	s.set(func(n int, ctx context.Context, send func(context.Context) error, _ func() error) error {
		if n >= 2 {
			once.Do(func() { close(settling) })
		}
		return rpctypes.ErrGRPCNoLeader
	})
	defer s.set(nil)
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(ctxFor(t, 30*time.Second), time.Minute) }()
	select {
	case <-settling:
	case err := <-extended:
		t.Fatalf("Extend returned before settling again: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the settle was not tried again")
	}
	start := time.Now()
	err = lease.Release(ctxFor(t, 300*time.Millisecond))
	t.Logf("Release while the Extend settles = %v after %v", err, time.Since(start))
	if err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("Release = %v after %v, want its ctx's error by its deadline", err, time.Since(start))
	}
	select {
	case err := <-extended:
		t.Logf("Extend = %v after %v", err, time.Since(start))
		if !errors.Is(err, fence.ErrLeaseLost) && !errors.Is(err, fence.ErrReleased) {
			t.Fatalf("Extend = %v, want the lease ended", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the Extend went on settling after the lease ended")
	}
	if n := countKeys(t, admin, l.Prefix(t.Name())); n != 0 {
		t.Fatalf("%d keys left once the lease ended", n)
	}
}

// The settle tries again only while the Extend's ctx lasts (and twice
// cleanupTimeout in any case): a caller whose ctx ends gets its Extend
// back by its deadline (it accepted 4 s for a ctx of 1.5 s before
// settleBehind), with ctx's error while the settle goes on in the
// background, and the lease then ends as lost, since etcd could not tell.
func TestExtendSettleStopsWithCtx(t *testing.T) {
	s := &txnScript{}
	l, lease, _ := scriptedLease(t, s, 30*time.Second)
	s.set(func(n int, ctx context.Context, send func(context.Context) error, _ func() error) error {
		return rpctypes.ErrGRPCNoLeader
	})
	defer s.set(nil)
	start := time.Now()
	err := lease.Extend(ctxFor(t, 1500*time.Millisecond), time.Minute)
	took := time.Since(start)
	t.Logf("Extend with no leader for 1.5 s of ctx = %v after %v", err, took)
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend = %v, want ctx's error (the settle going on) or ErrLeaseLost (over)", err)
	}
	if took < 1400*time.Millisecond || took > 1500*time.Millisecond+extendGrace {
		t.Fatalf("Extend took %v, want its ctx's 1.5 s and %v at most", took, extendGrace)
	}
	waitDone(t, lease, 3*time.Second)
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("lease Err = %v once the settle gave up, want ErrLeaseLost", lease.Err())
	}
	waitSettled(t, l, 5*time.Second)
}

// An Extend whose move got no answer and whose settle finds the key gone
// (an operator deleted it meanwhile, its etcd lease expired): the lock is
// no longer held, and Extend says so, as it does when the move itself
// finds the key gone, rather than returning the move's passing error and
// leaving the lease to its watch (here blind, on a member that hangs).
func TestExtendSettleFindsKeyGone(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	blind := make(chan struct{})
	c, err := clientv3.New(clientv3.Config{
		Endpoints: shared.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(s.intercept),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				if strings.HasSuffix(method, "/Watch") {
					select { // the watch's member hangs until the test ends
					case <-blind:
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}
				return streamer(ctx, desc, cc, method, opts...)
			}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	t.Cleanup(func() { close(blind) })
	l, err := etcdlock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	key := lease.(*etcdlock.Lease).Key()
	s.set(func(n int, ctx context.Context, send func(context.Context) error, _ func() error) error {
		if n == 0 {
			return rpctypes.ErrGRPCNoLeader
		}
		if n == 1 {
			if _, err := admin.Delete(ctx, key); err != nil {
				return err
			}
		}
		return send(ctx)
	})
	err = lease.Extend(ctxFor(t, 10*time.Second), time.Minute)
	s.set(nil)
	t.Logf("Extend with the key deleted before its settle = %v", err)
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend = %v with the key gone, want ErrLeaseLost", err)
	}
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("lease Err = %v with the key gone", lease.Err())
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
}

// The same on a real cluster: a caller whose ctx requires a leader
// (clientv3.WithRequireLeader) extends just as the cluster loses its
// quorum (two of three members paused, after the Grant, before the move),
// and gets it back a moment later. The move and the first settling Txn
// fail at once with ErrNoLeader (neither was applied): the lease, whose
// key sat untouched on its etcd lease, ended as lost, and the revokes then
// sent failed too, so the lock stayed held by nobody for the lease time.
// Now the settle tries again until the leader is back, and the lease goes
// on.
func TestExtendDuringQuorumLossKeepsLease(t *testing.T) {
	cl := etcdtest.StartCluster(t, 3)
	survivor := cl.Members[0]
	admin := newClient(t, []string{survivor.ClientURL}, nil)
	s := &txnScript{}
	l := scriptedLockerOf(t, []string{survivor.ClientURL}, s, nil)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	old := leaseID(t, lease)
	for _, m := range cl.Members[1:] {
		t.Cleanup(m.Cont)
	}
	noLeader := func() {
		for limit := time.Now().Add(15 * time.Second); ; {
			_, err := admin.Get(clientv3.WithRequireLeader(ctxFor(t, 5*time.Second)), "x")
			if errors.Is(err, rpctypes.ErrNoLeader) {
				return
			}
			if time.Now().After(limit) {
				t.Errorf("%s still has a leader 15 s after the others were paused: %v", survivor.Name, err)
				return
			}
			time.Sleep(50 * time.Millisecond) // polling with a deadline
		}
	}
	var moveErr, settleErr error
	s.set(func(n int, ctx context.Context, send func(context.Context) error, _ func() error) error {
		switch n {
		case 0: // the move: the quorum goes first
			for _, m := range cl.Members[1:] {
				m.Stop()
			}
			noLeader()
			moveErr = send(ctx)
			return moveErr
		case 1:
			settleErr = send(ctx)
			return settleErr
		case 2: // the quorum is back
			for _, m := range cl.Members[1:] {
				m.Cont()
			}
		}
		return send(ctx)
	})
	err = lease.Extend(clientv3.WithRequireLeader(ctxFor(t, 50*time.Second)), time.Minute)
	s.set(nil)
	t.Logf("Extend as the quorum went = %v (move %v, first settle %v)", err, moveErr, settleErr)
	if !errors.Is(moveErr, rpctypes.ErrGRPCNoLeader) || !errors.Is(settleErr, rpctypes.ErrGRPCNoLeader) {
		t.Fatalf("move %v, settle %v: want both refused with ErrNoLeader", moveErr, settleErr)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("the lease ended although its key was in place: %v", err)
	}
	etcdtest.Leader(t, cl)
	if id, _ := keyOn(t, admin, lease); id != old {
		t.Fatalf("the key is on etcd lease %x, want the old one %x", int64(id), int64(old))
	}
	if err := lease.Extend(ctxFor(t, 20*time.Second), time.Minute); err != nil {
		t.Fatalf("Extend with the quorum back: %v", err)
	}
	if err := lease.Release(ctxFor(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A careless caller extends a watchdog lease by an hour with a ctx that
// never ends, while the cluster refuses every Txn (no leader) but the
// watchdog's renewals go through: the settle tries again only until the
// lease's deadline as it was when Extend began (the move's own bound),
// not for as long as the renewals push it on, nor for the hour asked.
func TestExtendSettleBoundedByLeaseDeadline(t *testing.T) {
	s := &txnScript{}
	const ttl = 3 * time.Second
	l := scriptedLocker(t, s, &etcdlock.Options{WatchdogTTL: ttl})
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	s.set(func(n int, ctx context.Context, send func(context.Context) error, _ func() error) error {
		return rpctypes.ErrGRPCNoLeader
	})
	defer s.set(nil)
	start := time.Now()
	dl := lease.Deadline()
	done := make(chan error, 1)
	go func() { done <- lease.Extend(context.Background(), time.Hour) }()
	select {
	case err := <-done:
		t.Logf("Extend = %v after %v (the deadline was %v away)", err, time.Since(start), dl.Sub(start))
		if err == nil {
			t.Fatal("Extend succeeded with every Txn refused")
		}
	case <-time.After(time.Until(dl) + 5*time.Second):
		t.Fatalf("Extend still settling %v after the lease's deadline at its start", time.Since(dl))
	}
}

// A settling Txn applied with its reply lost (its attempt timed out): the
// next attempt finds the key changed, still the lease's and on its etcd
// lease, and takes its mod revision, so that the next Extend's move
// compares the right one and gets through; a lease that kept the old one
// would fail every Extend after.
func TestExtendSettleAppliedReplyLost(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	_, lease, old := scriptedLease(t, s, 20*time.Second)
	var applied atomic.Bool
	// The move is refused until the Extend's ctx ends (it is tried again
	// after Unavailable until then), and the settle runs past it, in the
	// background once the Extend has returned.
	ectx := ctxFor(t, 500*time.Millisecond)
	end, _ := ectx.Deadline()
	settles := 0
	s.set(func(n int, ctx context.Context, send func(context.Context) error, _ func() error) error {
		if triedBefore(ctx, end) {
			return rpctypes.ErrGRPCNoLeader // the move
		}
		if settles++; settles == 1 { // the settle: applied, its reply lost past its timeout
			<-ctx.Done()
			if err := send(context.WithoutCancel(ctx)); err != nil {
				return err
			}
			applied.Store(true)
			return ctx.Err()
		}
		return send(ctx)
	})
	err := lease.Extend(ectx, time.Minute)
	t.Logf("Extend = %v", err)
	if err == nil || lease.Err() != nil {
		t.Fatalf("Extend = %v, lease Err %v: want the move's error, the lease held", err, lease.Err())
	}
	if id, _ := keyOn(t, admin, lease); id != old {
		t.Fatalf("the key is on %x, want the old etcd lease %x", int64(id), int64(old))
	}
	// Once the settle is through (this waits for it).
	err = lease.Extend(ctxFor(t, 10*time.Second), time.Minute)
	s.set(nil)
	if !applied.Load() {
		t.Fatal("the settling Txn was not applied with its reply lost")
	}
	if err != nil {
		t.Fatalf("Extend after a settle whose reply was lost: %v", err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A settling Txn held back (its attempt timed out) while the next one
// gets through, then both it and the lost move arrive late: neither
// applies, the key stays as the settle left it.
func TestExtendLateSettleAndMove(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	l, lease, old := scriptedLease(t, s, 20*time.Second)
	s.set(func(n int, ctx context.Context, send func(context.Context) error, late func() error) error {
		if n < 2 { // the move, then the first settling Txn
			return s.hold(ctx, late)
		}
		return send(ctx)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := lease.Extend(ctx, time.Minute)
	t.Logf("Extend = %v", err)
	waitSettled(t, l, 5*time.Second) // the settle's second Txn, in the background
	s.set(nil)
	if err == nil || lease.Err() != nil {
		t.Fatalf("Extend = %v, lease Err %v: want ctx's error, the lease held", err, lease.Err())
	}
	id, rev := keyOn(t, admin, lease)
	if id != old {
		t.Fatalf("the key is on %x, want the old etcd lease %x", int64(id), int64(old))
	}
	for i, err := range s.sendHeld() {
		t.Logf("late Txn %d: %v", i, err)
	}
	if id2, rev2 := keyOn(t, admin, lease); id2 != id || rev2 != rev {
		t.Fatalf("after the late Txns the key is on %x at %d, want %x at %d", int64(id2), rev2, int64(id), rev)
	}
	if err := lease.Extend(ctxFor(t, 10*time.Second), time.Minute); err != nil {
		t.Fatalf("Extend after: %v", err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}
