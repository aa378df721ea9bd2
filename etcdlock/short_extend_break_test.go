package etcdlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/observetest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// shortTTL is what the Extends below shorten a lease of 20 s to.
const shortTTL = 2 * time.Second

// checkDeadlineWithinKeyLife fails the test if lease's Deadline is later
// than when etcd deletes its key, which sits on the etcd lease id: the
// etcd lease's remaining TTL (whole seconds, rounded down) and a second
// for that rounding.
func checkDeadlineWithinKeyLife(t *testing.T, admin *clientv3.Client, lease fence.Lease, id clientv3.LeaseID) {
	t.Helper()
	// The Deadline first: a renewal between the two reads lengthens the
	// key's life and may move the Deadline; read the other way round, it
	// moved the Deadline past a key life read before it (ci96: TTL 0 read,
	// then the watchdog's renewal of the new etcd lease, Deadline 1.93 s).
	deadline := lease.Deadline()
	ttl, err := admin.TimeToLive(ctxFor(t, 5*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	keyLife := time.Duration(ttl.TTL)*time.Second + time.Second
	left := time.Until(deadline)
	t.Logf("the key is on etcd lease %x, deleted within %v; the lease's Deadline is %v away (Err %v)", int64(id), keyLife, left.Round(time.Millisecond), lease.Err())
	if lease.Err() == nil && left > keyLife {
		t.Errorf("Deadline %v away while etcd deletes the key within %v: the holder believes it holds a lock etcd frees", left.Round(time.Millisecond), keyLife)
	}
}

// waitKeyMoved waits, up to limit, for lease's key to leave the etcd lease
// old, and returns the one it is on.
func waitKeyMoved(t *testing.T, admin *clientv3.Client, lease fence.Lease, old clientv3.LeaseID, limit time.Duration) clientv3.LeaseID {
	t.Helper()
	for end := time.Now().Add(limit); ; {
		if id, _ := keyOn(t, admin, lease); id != old {
			return id
		}
		if time.Now().After(end) {
			t.Fatalf("the key still on the old etcd lease %x %v later", int64(old), limit)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// An Extend that shortens a lease of 20 s to 2 s, whose move got no
// answer in its ctx (300 ms): Extend returns with the settle going on in
// the background, "the lease held meanwhile", and the move lands (sent
// late) before the settle's Txn is answered. The key is then on an etcd
// lease of 2 s, and the holder, back from Extend, must not read a
// Deadline 19 s away: etcd deletes the key (and another Locker takes the
// lock) within 2 s. The Deadline must not run past the shorter of the two
// from the moment the move is sent, until it is settled.
func TestShortExtendMoveLandsDuringBackgroundSettle(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	l, lease, old := scriptedLease(t, s, 20*time.Second)
	answer := make(chan struct{}) // the settle's first Txn answered once the test has looked
	extendMovedLate(t, s, l, lease, shortTTL, answer)
	g := waitKeyMoved(t, admin, lease, old, 5*time.Second)
	checkDeadlineWithinKeyLife(t, admin, lease, g)
	close(answer)
	waitSettled(t, l, 5*time.Second)
	checkDeadlineWithinKeyLife(t, admin, lease, g)
}

// The same in the foreground: an Extend (ctx 10 s) shortening a lease of
// 20 s to 2 s, whose move is applied but its reply held for the whole
// attempt (a sixth of the lease time, 3.3 s). While Extend waits, the key
// is on an etcd lease of 2 s, and the Deadline must say so, not 19 s.
func TestShortExtendReplyLostCapsDeadline(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	_, lease, old := scriptedLease(t, s, 20*time.Second)
	s.set(func(n int, ctx context.Context, send func(context.Context) error, _ func() error) error {
		if n == 0 { // the move: applied, its reply lost
			if err := send(context.WithoutCancel(ctx)); err != nil {
				return err
			}
			<-ctx.Done()
			return ctx.Err()
		}
		return send(ctx)
	})
	defer s.set(nil)
	done := make(chan error, 1)
	go func() { done <- lease.Extend(ctxFor(t, 10*time.Second), shortTTL) }()
	g := waitKeyMoved(t, admin, lease, old, 5*time.Second)
	checkDeadlineWithinKeyLife(t, admin, lease, g)
	err := <-done
	t.Logf("Extend = %v", err)
}

// A shortening Extend whose move never lands (held, then dropped), and
// whose settle puts the key back on its etcd lease: the cap that the
// move's send put on the Deadline is lifted, the lease's deadline is its
// etcd lease's again (19 s away, not 2 s), and the lease outlives the
// 2 s that the Extend asked for.
func TestShortExtendNotAppliedKeepsDeadline(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	l, lease, old := scriptedLease(t, s, 20*time.Second)
	dl := lease.Deadline()
	s.set(func(n int, ctx context.Context, send func(context.Context) error, _ func() error) error {
		if n == 0 { // the move: never sent
			<-ctx.Done()
			return ctx.Err()
		}
		return send(ctx)
	})
	defer s.set(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := lease.Extend(ctx, shortTTL)
	t.Logf("Extend = %v", err)
	if err == nil || errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend = %v, want its ctx's error, the lease held", err)
	}
	waitSettled(t, l, 5*time.Second)
	if got := lease.Deadline(); !got.Equal(dl) {
		t.Errorf("Deadline %v away after the move was settled on the old etcd lease, want %v as before", time.Until(got).Round(time.Millisecond), time.Until(dl).Round(time.Millisecond))
	}
	select {
	case <-lease.Done():
		t.Fatalf("lease ended: %v", lease.Err())
	case <-time.After(shortTTL + 500*time.Millisecond):
	}
	if id, _ := keyOn(t, admin, lease); id != old {
		t.Fatalf("the key is on %x, want the old etcd lease %x", int64(id), int64(old))
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A watchdog lease (4.5 s, renewed every 1.5 s) whose Extend to 2 s
// (ctx 1.2 s) gets no answer: Extend returns, the settle goes on in the
// background, the move lands late, and run renews the old etcd lease
// (which still exists, holding no key) before the settle's Txn is
// answered. That renewal must not move the Deadline past when etcd
// deletes the key on the new etcd lease, which nobody renews until the
// settle has found it there; then run renews the new one, and the lease
// goes on past its TTL.
func TestWatchdogRenewalDuringBackgroundSettle(t *testing.T) {
	admin := newClient(t, shared.Endpoints(), nil)
	s := &txnScript{}
	var renewals atomic.Int64
	c := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(s.intercept),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if method == "/etcdserverpb.Lease/LeaseKeepAlive" {
				renewals.Add(1) // KeepAliveOnce opens a stream each time
			}
			return streamer(ctx, desc, cc, method, opts...)
		}))
	const wdTTL = 4500 * time.Millisecond
	l, err := etcdlock.New(c, &etcdlock.Options{WatchdogTTL: wdTTL})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	old := leaseID(t, lease)
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	answer := make(chan struct{})
	s.set(func(n int, actx context.Context, send func(context.Context) error, late func() error) error {
		if ctx.Err() == nil { // the moves: held, sent late
			return s.hold(actx, late)
		}
		select { // the settle's: answered once the test has looked
		case <-answer:
			return send(actx)
		case <-actx.Done():
			return actx.Err()
		}
	})
	defer s.set(nil)
	err = lease.Extend(ctx, shortTTL)
	t.Logf("Extend = %v", err)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend = %v, want ctx's error while the move is settled", err)
	}
	if n := renewals.Load(); n != 0 {
		t.Fatalf("%d renewals before the settle: the test is too slow for its timing", n)
	}
	for i, err := range s.sendHeld() {
		t.Logf("late move %d: %v", i, err)
	}
	g := waitKeyMoved(t, admin, lease, old, 5*time.Second)
	// Wait for run's renewal of the old etcd lease (granted 5 s): its
	// TTL, 3 s left before, is back to 4 s or more.
	for end := time.Now().Add(3 * time.Second); ; {
		ttl, err := admin.TimeToLive(ctxFor(t, 5*time.Second), old)
		if err != nil {
			t.Fatal(err)
		}
		if renewals.Load() > 0 && ttl.TTL >= 4 {
			break
		}
		if time.Now().After(end) || lease.Err() != nil {
			t.Fatalf("the old etcd lease not renewed (%d renewals, TTL %d; lease Err %v)", renewals.Load(), ttl.TTL, lease.Err())
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end) && !t.Failed(); {
		checkDeadlineWithinKeyLife(t, admin, lease, g) // run may not have read the reply yet
		time.Sleep(20 * time.Millisecond)              // polling with a deadline
	}
	close(answer)
	waitSettled(t, l, 5*time.Second)
	if err := lease.Err(); err != nil {
		t.Fatalf("lease ended once the settle found the key on the new etcd lease: %v", err)
	}
	checkDeadlineWithinKeyLife(t, admin, lease, g)
	// run renews g now: the lease lasts past g's first TTL.
	select {
	case <-lease.Done():
		t.Fatalf("lease ended: %v", lease.Err())
	case <-time.After(shortTTL + time.Second):
	}
	if id, _ := keyOn(t, admin, lease); id != g {
		t.Fatalf("the key is on %x, want the new etcd lease %x", int64(id), int64(g))
	}
	checkDeadlineWithinKeyLife(t, admin, lease, g)
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A shortening Extend (30 s to 1 s, ctx 3 s) on a member that hangs after
// its Grant: the cap ends the lease when the second asked for has passed
// (its move may have been applied, and etcd would then delete the key),
// as lost, reported once; Extend gives up then too (it waited for its
// ctx's end, 3.1 s, before it was bounded by the capped deadline), and
// says lost; once the member answers, the revokes free the lock.
func TestShortExtendHungEndsAtItsTTL(t *testing.T) {
	rec := &observetest.Recorder{}
	l, _, gate := hungLocker(t, &etcdlock.Options{Observer: rec})
	lease := acquire(t, l, t.Name(), 30*time.Second)
	gate.hang()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	err := lease.Extend(ctx, time.Second)
	took := time.Since(start)
	t.Logf("Extend = %v after %v", err, took.Round(time.Millisecond))
	if !errors.Is(err, fence.ErrLeaseLost) || took > 2500*time.Millisecond {
		t.Errorf("Extend = %v after %v, want lost once the second asked for, its settle attempt and its revoke (half a second each) are over", err, took)
	}
	if left := time.Until(lease.Deadline()); left > 0 {
		t.Errorf("Deadline %v away after the second asked for passed", left)
	}
	resumeOnceSettled(t, l, gate, l.Prefix(t.Name()))
	if err := lease.Release(ctxFor(t, 5*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release = %v, want lost", err)
	}
	wantOneEnd(t, rec, true)
}
