package fencerueidis_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencerueidis"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// TestBlockingPoolOfTwoTwoLockers: New refuses a BlockingPoolSize of 1
// because a Locker's waiters' subscription (on a RESP2 client) holds one
// connection of rueidis's blocking pool, and a woken waiter's synced try
// needs another. Two Lockers on one client hold one each, so a pool of two
// is a pool of one again: a waiter woken by a release must get the lock.
//
// It failed: with BlockingPoolSize 2, RESP2 and replica sync, two Lockers
// on one client each with a waiter, the waiter woken by the release gave
// up 4.94 s after it, at the end of its 5 s budget, with the lock free
// ("the wait budget ran out confirming a grant of the lock to this waiter,
// given back; its replicas had not acknowledged it"), as with a pool of 1.
// New cannot tell how many Lockers will share a client (each is made on
// its own), so this is left as a design question: count the Lockers per
// client, take the subscription out of the pool, or say in the doc that
// the pool needs one connection per Locker and one more.
func TestBlockingPoolOfTwoTwoLockers(t *testing.T) {
	t.Skip("design question: with BlockingPoolSize 2 on a RESP2 client, two Lockers' subscriptions take the whole blocking pool, and a woken waiter's synced try waits out its budget with the lock free; New sees one Locker at a time")
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{primary.Addr}, BlockingPoolSize: 2, AlwaysRESP2: true, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	synced := &redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}}
	g, err := redislock.New(admin, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"two-lockers-a", "two-lockers-b"}
	var held []fence.Lease
	for _, name := range names {
		h, err := g.Acquire(ctx(t), name, fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
		defer h.Release(ctx(t)) //nolint:errcheck // the verdict is on the waiter
	}
	type result struct {
		err error
		at  time.Time
	}
	done := make(chan result, len(names))
	for _, name := range names {
		l, err := fencerueidis.New(c, synced)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			lease, err := l.Acquire(context.Background(), name, fence.Wait(5*time.Second))
			if err == nil {
				err = lease.Release(ctx(t))
			}
			done <- result{err, time.Now()}
		}()
		ch := lockKey(name) + ":released"
		waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1 })
	}
	if err := held[0].Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	r := <-done
	t.Logf("first waiter back %v after the release: %v", r.at.Sub(released).Round(time.Millisecond), r.err)
	if r.err != nil {
		t.Errorf("the waiter woken by the release = %v, want the lock", r.err)
	}
	if err := held[1].Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	<-done
}
