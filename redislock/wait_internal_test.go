package redislock

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// dialGate holds every dial made while armed until release is closed, then
// dials with the dial's own context, as net.Dialer would: a context that
// ended meanwhile fails the dial.
type dialGate struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (g *dialGate) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if g.armed.Load() {
			select {
			case g.entered <- struct{}{}:
			default:
			}
			<-g.release
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		return next(ctx, network, addr)
	}
}
func (g *dialGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (g *dialGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// eventually polls cond until it holds, failing the test after 10 s.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		<-tick.C
	}
}

// TestShortWaiterDoesNotFailOthers: waiter A, with a 1 ms budget, starts the
// shared subscription and its budget ends while the subscription is being
// dialled; waiter B (5 s) joined meanwhile. B must go on waiting and take
// the lock when the holder releases it, not fail with ErrHeld because A's
// context ended.
func TestShortWaiterDoesNotFailOthers(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "lock:payment:1001"
	holderClient := srv.Client(t)
	holders, err := New(holderClient, nil)
	if err != nil {
		t.Fatal(err)
	}
	held, err := holders.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}

	c := srv.Client(t)
	gate := &dialGate{entered: make(chan struct{}, 1), release: make(chan struct{})}
	c.AddHook(gate)
	// Pooled connections for the tries and for a waiter's withdrawal
	// (when its budget ends it leaves the queue): made by blocking calls
	// at once, so that only the subscription dials once the gate is armed.
	// Calls that go in a batch are pipelines, which go-redis sends on
	// connections of a pool of their own: made the same way.
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := c.BLPop(ctx, 50*time.Millisecond, "no-such-list").Err(); err != nil && err != redis.Nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				return p.BLPop(ctx, 50*time.Millisecond, "no-such-list").Err()
			})
			if err != nil && err != redis.Nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	gate.armed.Store(true) // from now on only the subscription dials
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	channel := l.keys(name).channel
	waiters := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		if w := l.subscriptions[channel]; w != nil {
			return len(w.waiters)
		}
		return 0
	}

	errA := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, name, fence.Wait(time.Millisecond))
		errA <- err
	}()
	<-gate.entered // A's subscription is being dialled
	type result struct {
		lease fence.Lease
		err   error
	}
	gotB := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, fence.Wait(5*time.Second), fence.TTL(time.Minute))
		gotB <- result{lease, err}
	}()
	var aDone error
	eventually(t, func() bool {
		select {
		case aDone = <-errA:
		default:
		}
		// B waits on the subscription: with A still in it, or alone
		// once A has left.
		return waiters() == 2 || aDone != nil && waiters() == 1
	})
	close(gate.release)
	if aDone == nil {
		aDone = <-errA
	}
	if !errors.Is(aDone, fence.ErrNotAcquired) || !errors.Is(aDone, fence.ErrHeld) {
		t.Errorf("A (1 ms budget) = %v, want ErrNotAcquired and ErrHeld", aDone)
	}
	// B is still waiting; the release hands it the lock.
	eventually(t, func() bool {
		n := holderClient.PubSubNumSub(ctx, channel).Val()[channel]
		select {
		case r := <-gotB:
			gotB <- r
			return true // B returned early; checked below
		default:
		}
		return n >= 1
	})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-gotB
	if r.err != nil {
		t.Fatalf("B (5 s budget) = %v, want the lock after the holder's release", r.err)
	}
	if r.lease.Token() <= held.Token() {
		t.Errorf("B's token %d, want > %d", r.lease.Token(), held.Token())
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRevokedAcquisitionRefuses: an acquisition given up on whose reply was
// lost is revoked; if its script runs after the revocation (both sat in a
// paused server's socket, in whichever order), it does not take the lock.
// If it ran first, the revocation deletes the lock.
func TestRevokedAcquisitionRefuses(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	const name = "lock:payment:1001"
	admin := srv.Client(t)
	for _, revokeFirst := range []bool{true, false} {
		a := l.newAttempt(name, time.Minute)
		if revokeFirst {
			l.releaseAbandoned(*a)
		}
		lease, _, err := l.try(ctx, a)
		if revokeFirst {
			if lease != nil || err != nil {
				t.Fatalf("revoked acquisition ran later: lease %v, err %v; want refused", lease, err)
			}
		} else {
			if err != nil || lease == nil {
				t.Fatalf("try: %v", err)
			}
			lease.end(fence.ErrReleased) // stops its expiry timer; the lock stays
			l.releaseAbandoned(*a)
		}
		if n := admin.Exists(ctx, a.keys.lock).Val(); n != 0 {
			t.Fatalf("revoke first %v: the lock is held", revokeFirst)
		}
	}
}

// TestRevocationOutlivesATakenLock: a waiting Acquire whose try times out
// on the client (server paused) tries again with the same owner, so two of
// its acquire scripts can sit in the server's socket, on two connections.
// When it gives up, the revocation may run between them: the first takes
// the lock, the revocation deletes it, and the second must not take it
// again for a full lease that nobody holds.
func TestRevocationOutlivesATakenLock(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	const name = "lock:payment:1001"
	a := l.newAttempt(name, time.Minute)
	lease, _, err := l.try(ctx, a) // the first try, run late
	if err != nil || lease == nil {
		t.Fatalf("try: %v", err)
	}
	lease.end(fence.ErrReleased)  // stops its expiry timer; the lock stays
	l.releaseAbandoned(*a)        // the give-up's revocation
	lease, _, err = l.try(ctx, a) // the retry, run after it
	if lease != nil {
		lease.end(fence.ErrReleased)
	}
	if lease != nil || err != nil {
		t.Errorf("the retry of a revoked acquisition took the lock again: lease %v, err %v", lease, err)
	}
	if n := srv.Client(t).Exists(ctx, a.keys.lock).Val(); n != 0 {
		t.Fatal("the lock is held by an acquisition that was given up on")
	}
}

// TestWakeUpPassesOnWhenWaiterLeaves: a release wakes one local waiter. If
// that waiter leaves before it uses the wake-up (its budget ends, its
// context is cancelled), the wake-up must pass to the next waiter, or the
// release reaches nobody.
func TestWakeUpPassesOnWhenWaiterLeaves(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	channel := l.keys("lock:payment:1001").channel
	wakeA, _, leaveA, err := l.join(ctx, channel, "a")
	if err != nil {
		t.Fatal(err)
	}
	wakeB, _, leaveB, err := l.join(ctx, channel, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer leaveB()
	if err := srv.Client(t).Publish(ctx, channel, "released").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return len(wakeA.wake) == 1 }) // A, the first, got it
	leaveA()                                                   // without using it
	select {
	case <-wakeB.wake:
	case <-ctx.Done():
		t.Fatal("the wake-up of a waiter that left reached nobody")
	}
}

// TestReleaseWhileSubscribing: the lock is released after a waiter's try
// found it held but before its subscription was confirmed; the release
// message reaches nobody. The waiter must try again as soon as it is
// subscribed, not sleep for the holder's TTL (a minute here).
func TestReleaseWhileSubscribing(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "lock:payment:1001"
	holders, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	held, err := holders.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c := srv.Client(t)
	gate := &dialGate{entered: make(chan struct{}, 1), release: make(chan struct{})}
	c.AddHook(gate)
	// Pooled connections for the tries and for a waiter's withdrawal
	// (when its budget ends it leaves the queue): made by blocking calls
	// at once, so that only the subscription dials once the gate is armed.
	// Calls that go in a batch are pipelines, which go-redis sends on
	// connections of a pool of their own: made the same way.
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := c.BLPop(ctx, 50*time.Millisecond, "no-such-list").Err(); err != nil && err != redis.Nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				return p.BLPop(ctx, 50*time.Millisecond, "no-such-list").Err()
			})
			if err != nil && err != redis.Nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	gate.armed.Store(true) // from now on only the subscription dials
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease fence.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		got <- result{lease, err}
	}()
	<-gate.entered // tried, found it held, now subscribing
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	close(gate.release)
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter = %v after %v; want the lock released while it subscribed", r.err, time.Since(released).Round(time.Millisecond))
	}
	if took := time.Since(released); took > 5*time.Second {
		t.Errorf("the waiter took the lock %v after the release", took)
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
