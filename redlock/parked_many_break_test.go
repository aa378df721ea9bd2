package redlock_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// TestManyParkedReleasesShareOneGoroutine: n leases are released while
// node 2 is down (its connections refused). Each release there is retried
// in the background within the lease time (TestReleaseOnRestartingPersistentNode);
// those retries must not cost a goroutine each, held for the lease time
// (a busy service releasing thousands of leases while one node restarts
// would pile up thousands, each dialing the dead node every second), but
// share one per node, as redislock's give-backs share one per Locker.
func TestManyParkedReleasesShareOneGoroutine(t *testing.T) {
	const n = 100
	srvs := make([]*redistest.Server, 3)
	for i := range srvs {
		srvs[i] = redistest.Start(t)
	}
	refused := make(chan struct{}, 4*n)
	hooks := []redis.Hook{nil, nil, refusedHook(refused)}
	cs := clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, hooks...)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(ctxFor(t)) })
	leases := make([]fence.Lease, n)
	for i := range leases {
		if leases[i], err = l.Acquire(ctxFor(t), "parked-many-"+string(rune('a'+i%26))+string(rune('a'+i/26)), fence.TTL(time.Minute)); err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
	}
	base := runtime.NumGoroutine()
	srvs[2].Kill()
	for _, ls := range leases {
		if err := ls.Release(ctxFor(t)); err != nil {
			t.Fatalf("Release with node 2 down: %v", err)
		}
	}
	for i := range n {
		select {
		case <-refused:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d releases on node 2 ended refused within 10 s", i, n)
		}
	}
	// The releases' own goroutines end at once; what stays is the retries'.
	deadline := time.Now().Add(10 * time.Second)
	for {
		extra := runtime.NumGoroutine() - base
		if extra <= 5 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines more than before, 10 s after %d releases refused by node 2 (a lease time of a minute): one per parked retry", extra, n)
		}
		time.Sleep(20 * time.Millisecond) // a poll with a deadline
	}
}
