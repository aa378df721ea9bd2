package fencerueidis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencerueidis"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// TestBlockingPoolOfOneRefused: rueidis's blocking pool carries replica
// sync's script and WAIT pairs, Status's reads, and, on a RESP2 client or
// one that routes to replicas, the connection the Locker's waiters
// subscribe on. With one connection, a waiter's subscription holds it, and
// the waiter's own try at the lock, once released, waits for it behind
// that: New must refuse BlockingPoolSize 1 (fence.ErrInvalidOption), and
// take 2.
//
// It failed: New took it, and on a RESP2 client with replica sync a waiter
// with a 5 s budget, woken by the release of the lock, gave up 4.98 s
// later with the lock free ("the wait budget ran out confirming a grant of
// the lock to this waiter, given back; its replicas had not
// acknowledged it"), as every waiter would; the Locker's synced renewals
// would stall the same way while anyone waited.
func TestBlockingPoolOfOneRefused(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	synced := &redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}}
	newClient := func(t *testing.T, o rueidis.ClientOption) rueidis.Client {
		t.Helper()
		c, err := rueidis.NewClient(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	t.Run("resp2", func(t *testing.T) {
		c := newClient(t, rueidis.ClientOption{InitAddress: []string{primary.Addr}, BlockingPoolSize: 1, AlwaysRESP2: true, DisableCache: true})
		l, err := fencerueidis.New(c, synced)
		if errors.Is(err, fence.ErrInvalidOption) {
			t.Logf("New: %v", err)
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		g, err := redislock.New(admin, nil)
		if err != nil {
			t.Fatal(err)
		}
		held, err := g.Acquire(ctx(t), "pool-of-one", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			lease, err := l.Acquire(context.Background(), "pool-of-one", fence.Wait(5*time.Second))
			if err == nil {
				err = lease.Release(ctx(t))
			}
			done <- err
		}()
		ch := lockKey("pool-of-one") + ":released"
		waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1 })
		if err := held.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		err = <-done
		t.Errorf("New took BlockingPoolSize 1; a waiter, woken by the release, returned %v %v later", err, time.Since(released).Round(time.Millisecond))
	})
	t.Run("routes-to-replicas", func(t *testing.T) {
		c := newClient(t, rueidis.ClientOption{InitAddress: []string{primary.Addr}, BlockingPoolSize: 1,
			Standalone: rueidis.StandaloneOption{ReplicaAddress: []string{replica.Addr}}, SendToReplicas: func(cmd rueidis.Completed) bool { return cmd.IsReadOnly() }})
		if _, err := fencerueidis.New(c, synced); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("New with BlockingPoolSize 1 = %v, want ErrInvalidOption", err)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		sentinels := redistest.StartSentinels(t, primary, 1)
		redistest.WaitSentinelsReady(t, sentinels, 1)
		c := newClient(t, rueidis.ClientOption{InitAddress: sentinels.Addrs(), Sentinel: rueidis.SentinelOption{MasterSet: sentinels.Master}, BlockingPoolSize: 1})
		if _, err := fencerueidis.New(c, synced); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("New with BlockingPoolSize 1 = %v, want ErrInvalidOption", err)
		}
	})
	t.Run("two", func(t *testing.T) {
		c := newClient(t, rueidis.ClientOption{InitAddress: []string{primary.Addr}, BlockingPoolSize: 2})
		if _, err := fencerueidis.New(c, synced); err != nil {
			t.Errorf("New with BlockingPoolSize 2 = %v, want a Locker", err)
		}
	})
}
