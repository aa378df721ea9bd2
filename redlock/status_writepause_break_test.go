package redlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// TestStatusDuringWritePauseAutoPipeliner: Status on nodes pausing writes
// (CLIENT PAUSE WRITE, a switchover), whose clients are go-redis
// AutoPipeliners, while an Acquire of the Locker, a write, waits out the
// pause on each: Status's script went in each AutoPipeliner's next batch,
// which waits for the batch in flight, and every node's read ended at the
// 2 s deadline ("context deadline exceeded" on 3 of 3 nodes before the
// fix), as redislock's did (TestStatusDuringWritePauseAutoPipeliner there).
func TestStatusDuringWritePauseAutoPipeliner(t *testing.T) {
	srvs := nodes(t, 3)
	cs := make([]redis.UniversalClient, len(srvs))
	for i, c := range clients(t, srvs) {
		ap, err := c.(*redis.Client).AutoPipeline()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ap.Close() })
		cs[i] = ap
	}
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	const name = "lock:status-writepause-ap"
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	for _, s := range srvs {
		if err := s.Client(t).Do(ctxFor(t), "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	actx := ctxFor(t) // ends after the Cleanup below
	go func() {
		other, err := l.Acquire(actx, name+":other", fence.TTL(time.Minute))
		if err == nil {
			err = other.Release(actx)
		}
		done <- err
	}()
	// Registered last: runs first, so that the Acquire returns and the
	// leases can be released.
	t.Cleanup(func() {
		for _, s := range srvs {
			_ = s.Client(t).Do(context.Background(), "CLIENT", "UNPAUSE").Err()
		}
		<-done // it may fail: the pause can outlast its node timeout
	})
	for _, s := range srvs {
		waitFor(t, func() bool { // the Acquire's script is held back
			return strings.Contains(s.Client(t).Info(ctxFor(t), "clients").Val(), "blocked_clients:1\r")
		})
	}
	c, cancel := context.WithTimeout(ctxFor(t), 2*time.Second)
	defer cancel()
	st, err := l.Status(c, name)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range st {
		if n.Err != nil || !n.Held || n.LastToken != lease.Token() {
			t.Errorf("node %d during a write pause = %+v; want held, token %d", i, n, lease.Token())
		}
	}
}
