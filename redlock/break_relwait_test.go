package redlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// Two Releases of one lease (a deferred one with no deadline and one with
// a short ctx, in another goroutine) while every node hangs: the first
// waits for the node timeout (2 s here); the second, given 200 ms, must
// return by its own ctx's deadline, not queue behind the first (it waited on a mutex)
// whatever its ctx says.
func TestSecondReleaseKeepsToItsCtx(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "second-release", 30 * time.Second
	_, rel := redlock.ScriptHashes()
	hooks := make([]redis.Hook, len(srvs))
	counts := make([]*countRelease, len(srvs))
	for i := range hooks {
		counts[i] = &countRelease{relHash: rel}
		hooks[i] = counts[i]
	}
	l, err := redlock.New(clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, hooks...),
		&redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	resume := pause(t, srvs)
	first := make(chan error, 1)
	go func() { first <- lease.Release(context.Background()) }()
	end := time.Now().Add(10 * time.Second)
	for counts[0].n.Load()+counts[1].n.Load()+counts[2].n.Load() < 3 {
		if time.Now().After(end) {
			t.Fatal("the first Release sent no deletes")
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	second := make(chan error, 1)
	go func() { second <- lease.Release(ctx) }()
	select {
	case err := <-second:
		t.Logf("second Release with a 200 ms ctx = %v after %v", err, time.Since(start))
		if err == nil {
			t.Fatal("second Release returned nil with every node hung")
		}
		if took := time.Since(start); took > 700*time.Millisecond {
			t.Fatalf("second Release with a 200 ms ctx took %v, behind the first", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("second Release still waiting 5 s in")
	}
	t.Logf("first Release = %v", <-first)
	resume()
}
