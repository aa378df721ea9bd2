package fencetest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/memlock"
)

// A backend whose reply that took the lock comes past a short lease's
// deadline gives the lock back and fails the Acquire with ErrLeaseLost
// (redislock did so in CI: a reply 240 ms after the try of a 200 ms
// lease, and 311 ms after the try of a 300 ms watchdog lease). The suite
// tries those Acquires again: run on a memlock that answers so the first
// time it is asked for each name's 200 ms lease and each name's watchdog
// lease taken without waiting, it passes.
func TestSuiteRetriesShortLeaseGivenBack(t *testing.T) {
	const watchdogTTL = 300 * time.Millisecond
	l, err := memlock.New(&memlock.Options{WatchdogTTL: watchdogTTL})
	if err != nil {
		t.Fatal(err)
	}
	g := &givesBackOnce{Locker: l, tried: map[string]bool{}, given: map[time.Duration]int{}, ttl: watchdogTTL}
	fencetest.Run(t, fencetest.Config{
		New:         func(testing.TB) fence.Locker { return g },
		Remove:      func(_ testing.TB, name string) { l.Remove(name) },
		WatchdogTTL: watchdogTTL,
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.given[200*time.Millisecond] == 0 || g.given[watchdogTTL] == 0 {
		t.Fatalf("leases given back, by lease time: %v; want 200ms and %v among them, or the test tests nothing", g.given, watchdogTTL)
	}
}

type givesBackOnce struct {
	*memlock.Locker
	mu    sync.Mutex
	tried map[string]bool       // name, lease time and wait budget of each Acquire
	given map[time.Duration]int // by lease time
	ttl   time.Duration         // the watchdog's lease time
}

func (g *givesBackOnce) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	called := time.Now()
	lease, err := g.Locker.Acquire(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	o, _ := fence.Apply(opts)
	ttl := o.TTL
	if ttl == 0 && o.Wait == 0 {
		ttl = g.ttl
	}
	key := fmt.Sprint(name, " ", ttl, " ", o.Wait)
	first := !g.tried[key]
	g.tried[key] = true
	late := first && (ttl == 200*time.Millisecond || ttl == g.ttl)
	if late {
		g.given[ttl]++
	}
	g.mu.Unlock()
	if !late {
		return lease, nil
	}
	// The reply comes past the lease's deadline (the suite does not retry a
	// give-back that came sooner: that reply was in time).
	time.Sleep(time.Until(called.Add(ttl + 10*time.Millisecond))) // injected latency: the reply on its way back
	_ = lease.Release(ctx)
	return nil, fence.NotAcquired(name, fmt.Errorf("%w: the reply that took the lock came too late; given back", fence.ErrLeaseLost))
}
