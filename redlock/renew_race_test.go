package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// gateExtend is a hook on one node's client that, when armed, keeps the
// next renewal (extend script) from being sent: hold keeps it until open is
// closed (a request slow on its way to the node), drop until its context
// ends, never sending it (a request lost on the way).
type gateExtend struct {
	hash     string
	hold     atomic.Bool
	drop     atomic.Bool
	late     atomic.Bool   // hold the reply, once the node ran it, until open is closed
	renewed  atomic.Bool   // the reply late held says the node renewed the lock (set before held is closed)
	held     chan struct{} // closed once a request is held
	open     chan struct{}
	deadline atomic.Int64 // the held request's deadline on the node's clock (ARGV[3])
}

func newGateExtend() *gateExtend {
	return &gateExtend{hash: redlock.ExtendHash(), held: make(chan struct{}), open: make(chan struct{})}
}

// gatedLocker returns a Locker over srvs with the generous node timeout,
// closed (within 10 s) when the test ends, whose clients honour the
// context's deadline on the socket and each carry a gateExtend, and the
// gates, by node.
func gatedLocker(t *testing.T, srvs []*redistest.Server) (*redlock.Locker, []*gateExtend) {
	t.Helper()
	gates := make([]*gateExtend, len(srvs))
	hooks := make([]redis.Hook, len(srvs))
	for i := range gates {
		gates[i] = newGateExtend()
		hooks[i] = gates[i]
	}
	cs := clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, hooks...)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	return l, gates
}

// warmLease acquires name for ttl and extends it once, which loads the
// extend script on every node, so that a renewal a test holds up is one
// EVALSHA per node.
// warmRelease acquires and releases name+"-warm" with lease time ttl, so
// that l's scripts are loaded and its connections made, and waits until
// every node's delete has run (past any hook, before a test arms it).
func warmRelease(t *testing.T, l *redlock.Locker, srvs []*redistest.Server, name string, ttl time.Duration) {
	t.Helper()
	warm, err := l.Acquire(ctxFor(t), name+"-warm", fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitUnlocked(t, srvs, name+"-warm", 5*time.Second)
}

func warmLease(t *testing.T, l *redlock.Locker, name string, ttl time.Duration) fence.Lease {
	t.Helper()
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Extend(ctxFor(t), ttl); err != nil {
		t.Fatal(err)
	}
	return lease
}

func (g *gateExtend) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gateExtend) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (g *gateExtend) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) != 7 || fmt.Sprint(a[1]) != g.hash {
			return next(ctx, cmd)
		}
		if g.drop.CompareAndSwap(true, false) {
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		if g.hold.CompareAndSwap(true, false) {
			d, _ := strconv.ParseInt(fmt.Sprint(a[6]), 10, 64)
			g.deadline.Store(d)
			close(g.held)
			<-g.open
		}
		if g.late.CompareAndSwap(true, false) {
			err := next(ctx, cmd)
			if c, ok := cmd.(*redis.Cmd); ok {
				if v, verr := c.Slice(); verr == nil && len(v) > 0 && v[0] == int64(1) { // extend.lua's {1, now}
					g.renewed.Store(true)
				}
			}
			close(g.held)
			<-g.open
			return err
		}
		return next(ctx, cmd)
	}
}

// waitNodePast waits, polling with a deadline, until s's clock reads past
// ms.
func waitNodePast(t *testing.T, s *redistest.Server, ms int64) {
	t.Helper()
	c := s.Client(t)
	limit := time.Now().Add(10 * time.Second)
	for {
		now, err := c.Time(ctxFor(t)).Result()
		if err != nil {
			t.Fatalf("TIME: %v", err)
		}
		if now.UnixMilli() > ms {
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("the node's clock did not pass %d ms", ms)
		}
		time.Sleep(2 * time.Millisecond) // polling with a deadline
	}
}

// Two renewals of one lease at once (the watchdog's and the holder's
// Extend, or two Extends): an older renewal, slow on its way to nodes 1
// and 2, reaches them after the lease's deadline it was sent under and is
// refused there; meanwhile a newer renewal moved the lock on nodes 0 and 1
// (its request to node 2 lost) and the deadline with it. The older one,
// finding the lock "gone" on two nodes, must not end the lease and give
// back node 0 while Deadline says it is held: that leaves the lock on node
// 1 alone, and another Locker takes nodes 0 and 2 while the first lease's
// Deadline is seconds ahead — two holders. This is what TestContention5
// found on a loaded machine (a watchdog lease extended by its holder).
func TestStaleRenewalLeavesNoSecondHolder(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "stale-renewal", 500 * time.Millisecond
	l, gates := gatedLocker(t, srvs)
	ctx := ctxFor(t)
	lease := warmLease(t, l, name, ttl)
	// The older renewal: run on node 0, held on its way to nodes 1 and 2.
	gates[1].hold.Store(true)
	gates[2].hold.Store(true)
	older := make(chan error, 1)
	go func() { older <- lease.Extend(ctx, 5*time.Second) }()
	for _, g := range gates[1:] {
		select {
		case <-g.held:
		case <-time.After(5 * time.Second):
			t.Fatal("the older renewal was not sent")
		}
	}
	// The newer renewal: its request to node 2 lost.
	gates[2].drop.Store(true)
	nctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	newer := lease.Extend(nctx, 5*time.Second)
	cancel()
	// The older renewal reaches nodes 1 and 2 past the deadline it
	// carries: both refuse it.
	for i, g := range gates[1:] {
		waitNodePast(t, srvs[i+1], g.deadline.Load())
	}
	close(gates[1].open)
	close(gates[2].open)
	var olderErr error
	select {
	case olderErr = <-older:
	case <-time.After(5 * time.Second):
		t.Fatal("the older renewal did not return")
	}
	gates[2].drop.Store(false)
	// Node 2's lock, renewed by neither, runs out on its own.
	limit := time.Now().Add(5 * time.Second)
	for len(lockedOn(t, srvs[2:], name)) > 0 {
		if time.Now().After(limit) {
			t.Fatal("node 2's lock did not run out")
		}
		time.Sleep(2 * time.Millisecond) // polling with a deadline
	}
	l2 := newLocker(t, srvs, nil)
	other, err := l2.Acquire(ctx, name, fence.TTL(time.Second))
	now := time.Now()
	if err == nil {
		defer func() { _ = other.Release(ctx) }()
	}
	t.Logf("older renewal: %v; newer renewal: %v; lease Err %v, Deadline %v from now; other Acquire: %v; locked on %v",
		olderErr, newer, lease.Err(), lease.Deadline().Sub(now), err, lockedOn(t, srvs, name))
	if err == nil && lease.Deadline().After(now) {
		t.Fatalf("two holders: another Locker acquired the lock (token %d) while the lease's Deadline is %v ahead (its Err: %v)",
			other.Token(), lease.Deadline().Sub(now), lease.Err())
	}
	if err != nil && !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("other Acquire: %v", err)
	}
	_ = lease.Release(ctx)
}

// slowAcquire is a hook on one node's client that, when armed, delays the
// reply of the next acquisition (the acquire script has three keys) by
// delay after the node ran it, or, with drop, never sends the request
// (a request lost on the way; it fails when its context ends).
type slowAcquire struct {
	delay time.Duration
	drop  bool
	armed atomic.Bool
}

func (h *slowAcquire) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowAcquire) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *slowAcquire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) < 3 || fmt.Sprint(a[2]) != "3" || !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmd)
		}
		if h.drop {
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		err := next(ctx, cmd)
		<-time.After(h.delay) // the reply slow on its way back: injected latency
		return err
	}
}

// A reply read late maps the lease's deadline early on its node's clock
// (nodeDeadline errs early by the reply's delay): node 1's grant, read
// 600 ms after it ran, has a renewal made at once refused there "as late"
// while the lease's Deadline is still ~400 ms ahead. Node 2's acquisition
// was lost, so the lock is on nodes 0 and 1 only. Counting that refusal
// as the lock gone, the renewal ended the lease and gave back node 0,
// leaving the lock on node 1 alone with Deadline ahead: another Locker
// took nodes 0 and 2 — two holders. That is TestContention5's failure on
// a loaded machine (a fixed-TTL lease whose Extend was refused as late 67
// ms before its Deadline, then a lease of another Locker beginning inside
// it). The renewal must fail without ending the lease; the lock stays on
// a majority until the deadline.
func TestRenewalRefusedEarlyKeepsLease(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "renew-refused-early", time.Second
	hooks := []*slowAcquire{{}, {delay: 600 * time.Millisecond}, {drop: true}}
	cs := clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, hooks[0], hooks[1], hooks[2])
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	ctx := ctxFor(t)
	// Warm: scripts loaded, connections made, before the timed try.
	warm, err := l.Acquire(ctx, name+"-warm", fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Extend(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	hooks[1].armed.Store(true)
	hooks[2].armed.Store(true)
	lease, err := l.Acquire(ctx, name, fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	extErr := lease.Extend(ctx, ttl)
	l2 := newLocker(t, srvs, nil)
	other, err := l2.Acquire(ctx, name, fence.TTL(time.Second))
	now := time.Now()
	if err == nil {
		defer func() { _ = other.Release(ctx) }()
	}
	t.Logf("Extend: %v; lease Err %v, Deadline %v from now; other Acquire: %v; locked on %v",
		extErr, lease.Err(), lease.Deadline().Sub(now), err, lockedOn(t, srvs, name))
	if err == nil && lease.Deadline().After(now) {
		t.Fatalf("two holders: another Locker acquired the lock (token %d) while the lease's Deadline is %v ahead (its Err: %v)",
			other.Token(), lease.Deadline().Sub(now), lease.Err())
	}
	if err != nil && !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("other Acquire: %v", err)
	}
	if lease.Deadline().After(now) && lease.Err() != nil {
		t.Errorf("the lease ended (%v) with its lock on a majority, %v before its deadline", lease.Err(), lease.Deadline().Sub(now))
	}
	_ = lease.Release(ctx)
}

// Two Extends of one lease at once with different lease times: the first,
// for 10 s, ran on every node, its replies slow on their way back; the
// second, for 300 ms, ran after it and returned. The first's replies, read
// last, must not set Deadline 10 s ahead: every node now expires 300 ms
// after the second ran, and Deadline would be later than the lock's
// expiry on every node. (Renewals take turns: the second waits for the
// first.)
func TestOlderRenewalReadLastKeepsDeadline(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "older-renewal-read-last"
	l, gates := gatedLocker(t, srvs)
	ctx := ctxFor(t)
	lease, err := l.Acquire(ctx, name, fence.TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Extend(ctx, 5*time.Second); err != nil { // loads the script on every node
		t.Fatal(err)
	}
	for _, g := range gates {
		g.late.Store(true)
	}
	first := make(chan error, 1)
	go func() { first <- lease.Extend(ctx, 10*time.Second) }()
	for _, g := range gates {
		select {
		case <-g.held:
		case <-time.After(5 * time.Second):
			t.Fatal("the first renewal did not run")
		}
	}
	second := make(chan error, 1)
	go func() { second <- lease.Extend(ctx, 300*time.Millisecond) }()
	select {
	case <-second: // read again below
		second <- nil
	case <-time.After(time.Second): // it waits for the first: renewals take turns
	}
	for _, g := range gates {
		close(g.open)
	}
	if err := <-first; err != nil {
		t.Fatalf("first Extend: %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second Extend: %v", err)
	}
	deadline := lease.Deadline()
	var pttls []time.Duration
	expiresFirst := 0
	for _, s := range srvs {
		d, err := s.Client(t).PTTL(ctx, lockKey(name)).Result()
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		pttls = append(pttls, d)
		// The node read its PTTL before after, rounded down to the ms:
		// its lock expires by after + d + 1 ms at the latest.
		if after.Add(d + time.Millisecond).Before(deadline) {
			expiresFirst++
		}
	}
	if expiresFirst >= l.Quorum() {
		t.Fatalf("Deadline is %v ahead, but the lock expires before it on %d nodes (PTTL %v)", time.Until(deadline), expiresFirst, pttls)
	}
	_ = lease.Release(ctx)
}

// Node 2's acquisition is lost on the way (never runs) and the lease is
// granted by nodes 0 and 1; node 1 then hangs. Release deletes the lock on
// node 0 and revokes the try on node 2, which answers 0: the lock is not
// this owner's there, and never will be (the mark refuses the acquisition
// if it comes after all). That frees a majority, as a delete does: Release
// must return nil at once, not count node 2 as "found gone" and wait for
// node 1 until the node timeout, then report no quorum (the failure seen
// under load in TestCloseDeadlineWithHungNode, whose node 2 had not run the
// acquisition yet).
func TestReleaseCountsRevokedNodeAsFreed(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "release-revoked", 30 * time.Second
	l, drop := droppingLocker(t, srvs, name, ttl)
	drop.armed.Store(true)
	lease := acquireFast(t, l, name, ttl)
	resume := pause(t, srvs[1:2])
	start := time.Now()
	err := lease.Release(ctxFor(t))
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Release with node 1 hung and node 2 revoked = %v after %v, want nil", err, took)
	}
	if took >= lateNodeTimeout/2 {
		t.Fatalf("Release took %v: it waited for the hung node (node timeout %v)", took, lateNodeTimeout)
	}
	if on := lockedOn(t, []*redistest.Server{srvs[0], srvs[2]}, name); len(on) != 0 {
		t.Fatalf("locked on running nodes %v after Release", on)
	}
	resume()
	if _, err := closeWithin(l, 10*time.Second); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("locked on %v after Close", on)
	}
}

// droppingLocker returns a Locker over srvs with the late clients and node
// timeout (closed within 10 s when the test ends), warmed up on name with
// a lease of ttl and left unlocked everywhere, and the slowAcquire hook on
// node 2's client that, once armed, drops the next acquisition there (it
// never runs).
func droppingLocker(t *testing.T, srvs []*redistest.Server, name string, ttl time.Duration) (*redlock.Locker, *slowAcquire) {
	t.Helper()
	drop := &slowAcquire{drop: true}
	cs := clientsWith(t, srvs, lateOptions, nil, nil, drop)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	warm := acquireFast(t, l, name, ttl) // scripts loaded, connections made
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
	return l, drop
}
