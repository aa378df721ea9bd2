package redlock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// TestCloseRacingRefusedRelease: node 2 is down; Releases of leases
// (granted by nodes 0 and 1) run concurrently with Close, so that node 2's
// refusals come just before, during or after Close. Whatever the order, no
// retry outlives Close for long (none started after it), and a second
// Close returns at once: no goroutine of the Locker is left.
func TestCloseRacingRefusedRelease(t *testing.T) {
	srvs := make([]*redistest.Server, 3)
	for i := range srvs {
		srvs[i] = redistest.Start(t)
	}
	srvs[2].Kill()
	for round := range 10 {
		cs := clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1})
		l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
		if err != nil {
			t.Fatal(err)
		}
		var leases []fence.Lease
		for i := range 5 {
			ls, err := l.Acquire(ctxFor(t), "close-race-"+string(rune('a'+i)), fence.TTL(time.Minute))
			if err != nil {
				t.Fatalf("Acquire with node 2 down: %v", err)
			}
			leases = append(leases, ls)
		}
		before := goleak.IgnoreCurrent()
		var wg sync.WaitGroup
		for _, ls := range leases {
			wg.Go(func() { _ = ls.Release(ctxFor(t)) })
		}
		if err := l.Close(ctxFor(t)); err != nil {
			t.Errorf("round %d: Close: %v", round, err)
		}
		wg.Wait()
		start := time.Now()
		if err := l.Close(ctxFor(t)); err != nil || time.Since(start) > time.Second {
			t.Errorf("round %d: second Close = %v after %v", round, err, time.Since(start))
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			// The clients still open: a retry started after Close would
			// go on for the lease time (a minute).
			err := goleak.Find(before, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: 5 s after Close: %v", round, err)
			}
			time.Sleep(20 * time.Millisecond) // a poll with a deadline
		}
		for _, c := range cs {
			_ = c.Close()
		}
	}
}
