package fencerueidis_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// TestWaitersSpareBlockingPool: on a RESP2 client, and on one that sends
// read-only commands to replicas, waiters subscribe on a dedicated
// connection of the primary, taken from rueidis's blocking pool
// (Dedicate), which is also where the script and WAIT of replica sync
// run. Waiters on several names must not take the pool from synced
// acquisitions and renewals of other names.
//
// It failed on both clients: each name waited on held a pooled connection
// of its own, so with BlockingPoolSize 2 and two names waited on, the
// synced Acquire of a third name waited for the pool and ended at its 3 s
// deadline ("stopped waiting for the reply: context deadline exceeded
// after 3.001s"); a watchdog's synced renewals would stall the same way
// and its lease be lost. With the default pool (1024) it took that many
// names waited on at once. The waiters now share one connection per
// adapter (a pool of 1 would still be taken by the first waiter: New
// refuses it, TestBlockingPoolOfOneRefused).
func TestWaitersSpareBlockingPool(t *testing.T) {
	readOnly := func(cmd rueidis.Completed) bool { return cmd.IsReadOnly() }
	for _, kind := range []string{"resp2", "replica-routing"} {
		t.Run(kind, func(t *testing.T) {
			primary := redistest.Start(t)
			replica := redistest.StartReplica(t, primary)
			redistest.WaitReplicated(t, primary, 1)
			admin := primary.Client(t)
			g, err := redislock.New(admin, nil)
			if err != nil {
				t.Fatal(err)
			}
			opt := rueidis.ClientOption{InitAddress: []string{primary.Addr}, BlockingPoolSize: 2}
			if kind == "resp2" {
				opt.AlwaysRESP2, opt.DisableCache = true, true
			} else {
				opt.Standalone.ReplicaAddress, opt.SendToReplicas = []string{replica.Addr}, readOnly
			}
			c, err := rueidis.NewClient(opt)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			l := newLocker(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}})
			wctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var waiters sync.WaitGroup
			for i := range opt.BlockingPoolSize {
				name := fmt.Sprintf("waited%d", i)
				held, err := g.Acquire(ctx(t), name, fence.TTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = held.Release(ctx(t)) }()
				waiters.Go(func() { _, _ = l.Acquire(wctx, name, fence.Wait(time.Minute)) })
				ch := lockKey(name) + ":released"
				waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1 })
			}
			defer waiters.Wait()
			defer cancel()
			dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer dcancel()
			start := time.Now()
			lease, err := l.Acquire(dctx, "other", fence.TTL(time.Minute))
			t.Logf("synced Acquire of another name while %d names are waited on: %v after %v", opt.BlockingPoolSize, err, time.Since(start).Round(time.Millisecond))
			if err != nil {
				t.Errorf("synced Acquire of another name = %v, want the lease", err)
			} else if err := lease.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
}
