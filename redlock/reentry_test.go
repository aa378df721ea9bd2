package redlock_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// releaser is an Observer that releases the lease whose end it is told, as
// a holder's "on lease lost, release and clean up" would, and sends what
// Release returned.
type releaser struct {
	fence.NopObserver
	lease chan fence.Lease // the lease to release, handed over once held
	done  chan error
}

func (r *releaser) LeaseEnded(fence.LeaseEvent) {
	select {
	case lease := <-r.lease:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r.done <- lease.Release(ctx)
	default: // not the lease under test (or told already)
	}
}

// The lock is deleted on two of three nodes, not all: the watchdog's
// renewal finds it gone on a majority, ends the lease and gives back node
// 2, and the Observer, told on the watchdog's goroutine, calls Release,
// which waits for the watchdog to be done. It returns ErrLeaseLost, and
// no node keeps the lock. Before the fix, the renewal reported the end
// before the watchdog was done, and the Release in the callback waited for
// it for ever.
func TestObserverReleasesOnLossFoundByRenewal(t *testing.T) {
	srvs := nodes(t, 3)
	r := &releaser{lease: make(chan fence.Lease, 1), done: make(chan error, 1)}
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: 300 * time.Millisecond, NodeTimeout: generous, Observer: r})
	const name = "reentry-majority"
	lease, err := l.Acquire(ctxFor(t), name)
	if err != nil {
		t.Fatal(err)
	}
	r.lease <- lease
	// Acquire returns on a majority: the third node's acquisition may
	// still be on its way (a loaded machine), and, run after the DEL
	// below on its node, it left the lock on a majority, renewed for ever
	// (the test hung so once in a make unit).
	deadline := time.Now().Add(10 * time.Second)
	for len(lockedOn(t, srvs, name)) < len(srvs) {
		if time.Now().After(deadline) {
			t.Fatal("the acquisition did not run on every node")
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
	for _, s := range srvs[:2] {
		if err := s.Client(t).Del(ctxFor(t), lockKey(name)).Err(); err != nil {
			t.Fatalf("DEL: %v", err)
		}
	}
	select {
	case err := <-r.done:
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release from LeaseEnded = %v, want ErrLeaseLost", err)
		}
	case <-time.After(10 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("Release from LeaseEnded did not return within 10s (deadlock?); goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}
	if err := lease.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("still locked on nodes %v after the loss and the Release", on)
	}
}

// closer is an Observer whose LeaseEnded runs do, once, on the first end
// it is told of, and sends what do returned; it counts every end by token.
type closer struct {
	fence.NopObserver
	do   atomic.Pointer[func() error]
	done chan error
	mu   sync.Mutex
	ends map[fence.Token][]fence.LeaseCause
}

func newCloser() *closer {
	return &closer{done: make(chan error, 1), ends: map[fence.Token][]fence.LeaseCause{}}
}

func (c *closer) LeaseEnded(ev fence.LeaseEvent) {
	c.mu.Lock()
	c.ends[ev.Token] = append(c.ends[ev.Token], ev.Cause)
	c.mu.Unlock()
	if do := c.do.Swap(nil); do != nil {
		c.done <- (*do)()
	}
}

func (c *closer) causes(tok fence.Token) []fence.LeaseCause {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]fence.LeaseCause(nil), c.ends[tok]...)
}

func awaitCallback(t *testing.T, c *closer) error {
	t.Helper()
	select {
	case err := <-c.done:
		return err
	case <-time.After(10 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("the callback did not return within 10s (deadlock?); goroutines:\n%s", buf[:runtime.Stack(buf, true)])
		return nil
	}
}

// Close releases the leases still held, a watchdog one and one of a fixed
// TTL: each end is reported once, as Released, by the time Close returns.
func TestObserverToldOfClose(t *testing.T) {
	srvs := nodes(t, 3)
	c := newCloser()
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: 300 * time.Millisecond, NodeTimeout: generous, Observer: c})
	a, err := l.Acquire(ctxFor(t), "close-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctxFor(t), "close-b", fence.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctxFor(t)); err != nil {
		t.Fatalf("Close = %v", err)
	}
	for _, ls := range []fence.Lease{a, b} {
		if got := c.causes(ls.Token()); len(got) != 1 || got[0] != fence.Released {
			t.Errorf("%v: reports %v once Close returned, want [released]", ls, got)
		}
	}
}

// The Observer, told that a lease was lost (found by the watchdog), calls
// Close, which releases the Locker's other lease: no deadlock, each end
// reported once.
func TestObserverClosesOnLoss(t *testing.T) {
	srvs := nodes(t, 3)
	c := newCloser()
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: 300 * time.Millisecond, NodeTimeout: generous, Observer: c})
	lost, err := l.Acquire(ctxFor(t), "close-lost")
	if err != nil {
		t.Fatal(err)
	}
	other, err := l.Acquire(ctxFor(t), "close-other")
	if err != nil {
		t.Fatal(err)
	}
	do := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return l.Close(ctx)
	}
	c.do.Store(&do)
	for _, s := range srvs {
		if err := s.Client(t).Del(ctxFor(t), lockKey("close-lost")).Err(); err != nil {
			t.Fatalf("DEL: %v", err)
		}
	}
	if err := awaitCallback(t, c); err != nil {
		t.Errorf("Close from LeaseEnded = %v", err)
	}
	if err := other.Err(); !errors.Is(err, fence.ErrReleased) {
		t.Errorf("the other lease's Err after Close = %v, want ErrReleased", err)
	}
	if got := c.causes(lost.Token()); len(got) != 1 || got[0] == fence.Released {
		t.Errorf("lost lease: reports %v, want one loss", got)
	}
	if got := c.causes(other.Token()); len(got) != 1 || got[0] != fence.Released {
		t.Errorf("other lease: reports %v, want [released]", got)
	}
}

// The Observer, told that Release ended one lease, releases another lease
// of the same Locker, whose own report comes on the same goroutine.
func TestObserverReleasesAnotherLease(t *testing.T) {
	srvs := nodes(t, 3)
	c := newCloser()
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: 300 * time.Millisecond, NodeTimeout: generous, Observer: c})
	a, err := l.Acquire(ctxFor(t), "another-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctxFor(t), "another-b")
	if err != nil {
		t.Fatal(err)
	}
	do := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return b.Release(ctx)
	}
	c.do.Store(&do)
	relErr := make(chan error, 1)
	go func() { relErr <- a.Release(ctxFor(t)) }()
	if err := awaitCallback(t, c); err != nil {
		t.Errorf("Release of the other lease from LeaseEnded = %v", err)
	}
	if err := <-relErr; err != nil {
		t.Errorf("Release = %v", err)
	}
	for _, ls := range []fence.Lease{a, b} {
		if got := c.causes(ls.Token()); len(got) != 1 || got[0] != fence.Released {
			t.Errorf("%v: reports %v, want [released]", ls, got)
		}
	}
}
