package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// A caller whose deadline is shorter than the node timeout gets its answer
// by its deadline, even when a node that granted the try hangs before it
// can be given the try back: the try fails (no majority by the deadline),
// and its release on the node that granted it must not keep the caller
// waiting for the node timeout.
func TestCallerDeadlineWithGrantedNodeHung(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "deadline-granted-hung"
	l := lateLocker(t, srvs, name)
	pause(t, srvs[1:]) // no majority can grant before the deadline
	redlock.SetBeforeReplies(l, func() {
		// Node 0 granted the try; it hangs before its release.
		waitLocked(t, srvs[0], name, 5*time.Second)
		srvs[0].Signal(syscall.SIGSTOP)
		t.Cleanup(func() { srvs[0].Signal(syscall.SIGCONT) })
	})
	const budget = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(ctxFor(t), budget)
	defer cancel()
	start := time.Now()
	_, err := l.Acquire(ctx, name, fence.TTL(30*time.Second))
	took := time.Since(start)
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	if took > budget+lateNodeTimeout/4 {
		t.Fatalf("Acquire with a %v deadline took %v (node timeout %v): it waited for the hung node that granted", budget, took, lateNodeTimeout)
	}
	redlock.SetBeforeReplies(l, nil)
	for _, s := range srvs {
		s.Signal(syscall.SIGCONT)
	}
	// Nothing of the try is left once the nodes woke.
	waitUnlocked(t, srvs, name, 5*time.Second)
}

// soakLocker returns a Locker over srvs with a short node timeout, whose
// clients leave a request to it (the socket has no deadline of its own).
func soakLocker(t *testing.T, srvs []*redistest.Server, timeout time.Duration) *redlock.Locker {
	t.Helper()
	cs := clientsWith(t, srvs, lateOptions)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Rounds of acquisitions on 5 masters with 1 or 2 of them paused at random
// and woken at random moments, callers cancelling at random, leases
// extended and released (sometimes twice, sometimes concurrently with an
// Extend): once every node is awake and the node timeout has passed, no
// node may hold the lock (the lease time is 30 s: a leak outlasts the
// check by far), and every revocation mark must expire.
func TestSoakLateGrantsLeaveNothing(t *testing.T) {
	srvs := nodes(t, 5)
	const name, ttl, timeout = "soak", 30 * time.Second, 300 * time.Millisecond
	l := soakLocker(t, srvs, timeout)
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 1))
	acquired := 0
	for round := range 25 {
		var slow []*redistest.Server
		for _, i := range rng.Perm(5)[:1+rng.IntN(2)] {
			slow = append(slow, srvs[i])
		}
		for _, s := range slow {
			s.Signal(syscall.SIGSTOP)
		}
		var once sync.Once
		resume := func() {
			once.Do(func() {
				for _, s := range slow {
					s.Signal(syscall.SIGCONT)
				}
			})
		}
		t.Cleanup(resume)
		wake := time.AfterFunc(time.Duration(rng.IntN(int(2*timeout))), resume)
		ctx, cancel := context.WithCancel(ctxFor(t))
		switch rng.IntN(3) {
		case 0:
			ctx, cancel = context.WithTimeout(ctxFor(t), time.Duration(1+rng.IntN(20))*time.Millisecond)
		case 1:
			// Cancelled once the requests are out, before or after some
			// replies were read.
			redlock.SetBeforeReplies(l, cancel)
		}
		lease, err := l.Acquire(ctx, name, fence.TTL(ttl))
		redlock.SetBeforeReplies(l, nil)
		cancel()
		if err != nil {
			if !errors.Is(err, fence.ErrNotAcquired) {
				t.Fatalf("round %d: Acquire = %v, want ErrNotAcquired", round, err)
			}
		} else {
			acquired++
			var wg sync.WaitGroup
			if rng.IntN(2) == 0 {
				wg.Add(1)
				go func() { defer wg.Done(); _ = lease.Extend(ctxFor(t), ttl) }()
			}
			rctx, rcancel := context.WithCancel(ctxFor(t))
			if rng.IntN(4) == 0 {
				rcancel() // a careless caller: Release with a context already ended
			}
			_ = lease.Release(rctx)
			rcancel()
			if rng.IntN(2) == 0 {
				_ = lease.Release(ctxFor(t))
			}
			wg.Wait()
		}
		if rng.IntN(2) == 0 {
			resume()
		}
		<-timeAfter(wake, resume)
		// Every node awake: within a few node timeouts (and the
		// background retries' back-off), nothing is locked.
		waitUnlocked(t, srvs, name, 10*timeout+2*time.Second)
	}
	t.Logf("%d of 25 rounds acquired", acquired)
	for i, s := range srvs {
		marks, err := s.Client(t).Keys(ctxFor(t), lockKey(name)+":revoked:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range marks {
			pttl, err := s.Client(t).PTTL(ctxFor(t), m).Result()
			if err != nil || pttl <= 0 || pttl > time.Minute {
				t.Fatalf("node %d: revocation mark %s has PTTL %v, %v", i, m, pttl, err)
			}
		}
	}
}

// timeAfter returns a channel closed once the timer wake has run f, or at
// once after running f itself if it had not fired yet.
func timeAfter(wake *time.Timer, f func()) <-chan struct{} {
	wake.Stop()
	f()
	c := make(chan struct{})
	close(c)
	return c
}

// The order of tokens survives a node that restarts without persistence
// when the other node of the next majority was told the lease's token
// (TestTokenSurvivesRestartWithoutPersistence). A node whose grant came
// after Acquire decided was not told it: here node 0's record is an hour
// ahead (clocks set back), node 2 is paused while a is acquired on nodes 0
// and 1 and grants late; node 0 then restarts empty and node 1 goes down,
// and b, acquired on nodes 0 and 2, must still get a greater token.
func TestTokenSurvivesRestartBesideLateNode(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "restart-late", 30 * time.Second
	l := lateLocker(t, srvs, name)
	ahead := time.Now().Add(time.Hour).UnixMicro()
	if err := srvs[0].Client(t).Set(ctxFor(t), lockKey(name)+":token", ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	resume := pause(t, srvs[2:])
	a := acquireFast(t, l, name, ttl)
	if a.Token() <= fence.Token(ahead) {
		t.Fatalf("token %d, want > node 0's record %d", a.Token(), ahead)
	}
	resume()
	waitLocked(t, srvs[2], name, 5*time.Second)
	// Node 2's grant has been read and joined the lease, or is on its
	// way: Release covers it either way.
	if err := a.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
	srvs[0].Restart(t)
	srvs[1].Kill()
	b, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire on nodes 0 and 2: %v", err)
	}
	defer b.Release(ctxFor(t))
	if b.Token() <= a.Token() {
		t.Fatalf("token on nodes 0 (restarted empty) and 2 (granted a late) %d, want > a's %d: two holders of the name in turn with tokens going back", b.Token(), a.Token())
	}
}

// Extend, Release and Release again called at once on one lease, while a
// paused node's grant comes in (woken at the same time): no data race,
// Release's answers agree, and nothing stays locked.
func TestConcurrentCallsWithLateGrant(t *testing.T) {
	srvs := nodes(t, 5)
	const name, ttl = "concurrent-late", 30 * time.Second
	l := lateLocker(t, srvs, name)
	for round := range 3 {
		resume := pause(t, srvs[3:])
		lease := acquireFast(t, l, name, ttl)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		start := make(chan struct{})
		wg.Add(4)
		go func() { defer wg.Done(); <-start; resume() }()
		go func() { defer wg.Done(); <-start; _ = lease.Extend(ctxFor(t), ttl) }()
		for k := range 2 {
			go func() { defer wg.Done(); <-start; errs[k] = lease.Release(ctxFor(t)) }()
		}
		close(start)
		wg.Wait()
		if errs[0] != nil && errs[1] != nil {
			t.Fatalf("round %d: both Releases failed: %v; %v", round, errs[0], errs[1])
		}
		if lease.Err() == nil {
			t.Fatalf("round %d: lease held after Release", round)
		}
		waitUnlocked(t, srvs, name, 5*time.Second)
	}
}

// Every node hung: an Acquire whose deadline, or whose wait budget, is
// shorter than the node timeout returns by it with ErrNotAcquired; the
// requests left in the hung nodes' sockets leave nothing locked once they
// wake.
func TestAllNodesHungCallerDeadline(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "all-hung"
	l := lateLocker(t, srvs, name)
	resume := pause(t, srvs)
	const budget = 200 * time.Millisecond
	for _, how := range []string{"deadline", "wait"} {
		ctx, cancel := context.WithTimeout(ctxFor(t), budget)
		opts := []fence.Option{fence.TTL(30 * time.Second)}
		if how == "wait" {
			cancel()
			ctx, cancel = context.WithCancel(ctxFor(t))
			opts = append(opts, fence.Wait(budget))
		}
		start := time.Now()
		_, err := l.Acquire(ctx, name, opts...)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("%s: Acquire with every node hung = %v, want ErrNotAcquired", how, err)
		}
		if took > budget+lateNodeTimeout/4 {
			t.Fatalf("%s: Acquire with a %v budget took %v (node timeout %v)", how, budget, took, lateNodeTimeout)
		}
	}
	resume()
	waitUnlocked(t, srvs, name, 10*time.Second)
}

// holdAcquireReply is a hook that, once armed, keeps the first acquisition
// reply (the acquire script has three keys) from its caller until release
// is closed: a reply slow on its way back, read after Acquire decided.
type holdAcquireReply struct {
	armed   atomic.Bool
	held    chan struct{} // closed once a reply is held
	release chan struct{}
	// key, if set, must be in the script's first key: a script of another
	// name's (a warm-up's Release still running on this node) is not held.
	key string
}

func (h *holdAcquireReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdAcquireReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *holdAcquireReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); len(a) > 3 && fmt.Sprint(a[2]) == "3" && strings.Contains(fmt.Sprint(a[3]), h.key) && h.armed.CompareAndSwap(true, false) {
			close(h.held)
			<-h.release
		}
		return err
	}
}

// As TestTokenSurvivesRestartBesideLateNode, with node 2's grant read only
// after Release deleted the lock there (the reply slow on its way back):
// Release, which revokes the acquisition on node 2, must leave node 2's
// record at the lease's token, or the next majority of nodes 0 (restarted
// empty) and 2 issues a smaller token.
func TestTokenSurvivesRestartBesideGrantReadAfterRelease(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "restart-late-release", 30 * time.Second
	h := &holdAcquireReply{held: make(chan struct{}), release: make(chan struct{})}
	cs := clientsWith(t, srvs, lateOptions, nil, nil, h)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(h.release)
		// The held reply's give-back goes on: wait for it before the
		// clients close.
		_, _ = closeWithin(l, 10*time.Second)
	})
	warmUp(t, l, srvs, name, ttl) // waits for every node: Release returns at a majority
	ahead := time.Now().Add(time.Hour).UnixMicro()
	if err := srvs[0].Client(t).Set(ctxFor(t), lockKey(name)+":token", ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	h.armed.Store(true)
	a := acquireFast(t, l, name, ttl)
	// Acquire returns at a majority: node 2's request may still be on its
	// way (a loaded machine), and its reply must be held before Release.
	select {
	case <-h.held:
	case <-time.After(5 * time.Second):
		t.Fatal("node 2's acquisition reply was not held")
	}
	if err := a.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
	srvs[0].Restart(t)
	srvs[1].Kill()
	b, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire on nodes 0 and 2: %v", err)
	}
	defer b.Release(ctxFor(t))
	if b.Token() <= a.Token() {
		t.Fatalf("token on nodes 0 (restarted empty) and 2 (its grant read after Release) %d, want > a's %d", b.Token(), a.Token())
	}
}
