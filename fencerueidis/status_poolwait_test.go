package fencerueidis_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// TestCallsLeaveNoPoolWaitPastDeadline: Status's reads and replica sync's
// script and WAIT pairs run on connections of rueidis's blocking pool.
// While the pool is taken (here: BlockingPoolSize 2, both connections
// held by synced acquisitions whose WAIT waits 5 s for a paused replica),
// a Status and a synced Acquire with a 500 ms deadline must return by it,
// and leave nothing waiting for the pool once they have.
//
// Both returned by their deadline before (redislock leaves a call that
// outlives its ctx on a call goroutine), but Status's reads took their
// connection through rueidis's Dedicated, whose wait for the pool takes no
// context: its call goroutine went on waiting for the pool after Status
// had returned ("still waiting for the blocking pool 1s after Status
// returned: fencerueidis.conn.eval … (*singleClient).Dedicated"), until
// a connection came back (the WAITs' end, 4.5 s later), and every Status
// made meanwhile left another. The synced Acquire's pair, a DoMulti,
// waited for the pool under its context already, and left nothing. (A
// pool wait that ends at its context frees a slot in rueidis v1.0.79: the
// dead connection it returns is given back and counted, so the pool grows
// past its size by one; the stranded Status call took that slot.)
func TestCallsLeaveNoPoolWaitPastDeadline(t *testing.T) {
	const deadline, slack, wait = 500 * time.Millisecond, 300 * time.Millisecond, 5 * time.Second
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{primary.Addr}, BlockingPoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	l := newLocker(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: wait}})
	resume := replica.Pause(t)
	var holders sync.WaitGroup
	defer holders.Wait()
	defer resume()
	for i := range 2 {
		holders.Go(func() {
			// Resumed at the end, the replica confirms it, or not.
			lease, err := l.Acquire(ctx(t), fmt.Sprintf("pool-holder%d", i), fence.TTL(time.Minute))
			if err == nil {
				err = lease.Release(ctx(t))
			}
			if err != nil && !errors.Is(err, fence.ErrNotReplicated) {
				t.Errorf("Acquire with the replica paused = %v, want a lease or ErrNotReplicated", err)
			}
		})
	}
	waitFor(t, func() bool { // both WAITs hold their connection
		return strings.Contains(admin.Info(ctx(t), "clients").Val(), "blocked_clients:2\r")
	})
	calls := []struct {
		name string
		call func(context.Context) error
	}{
		{"Status", func(ctx context.Context) error { _, err := l.Status(ctx, "pool-other"); return err }},
		{"synced Acquire", func(ctx context.Context) error {
			_, err := l.Acquire(ctx, "pool-other", fence.TTL(time.Minute))
			return err
		}},
	}
	for _, c := range calls {
		dctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		err := c.call(dctx)
		took := time.Since(start)
		cancel()
		t.Logf("%s while the pool is taken: %v after %v", c.name, err, took.Round(time.Millisecond))
		if took > deadline+slack {
			t.Errorf("%s took %v with a %v deadline", c.name, took, deadline)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s = %v, want an error matching context.DeadlineExceeded", c.name, err)
		}
		if g := poolWaiter(slack); g != "" {
			t.Errorf("still waiting for the blocking pool %v after %s returned:\n%s", slack, c.name, g)
		}
	}
}

// poolWaiter returns the stack of a goroutine of the adapter's calls that
// waits for a connection of a rueidis pool, if one still does after
// within, or "".
func poolWaiter(within time.Duration) string {
	deadline := time.Now().Add(within)
	buf := make([]byte, 1<<20)
	for {
		buf = buf[:runtime.Stack(buf[:cap(buf)], true)]
		var found string
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			if strings.Contains(g, "rueidis.(*pool).Acquire(") && strings.Contains(g, "fencerueidis.conn.eval(") {
				found = g
				break
			}
		}
		if found == "" || time.Now().After(deadline) {
			return found
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}
