package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestHandoffBetweenClusterClientAndWrapper: two Lockers on one cluster and
// one lock name, as in two processes of one service, one given the
// *redis.ClusterClient, the other a struct embedding it behind the
// redis.UniversalClient interface (supported with replica sync off: the
// scripts route by key). A release by either must reach a waiter of the
// other: the lock, granted to that waiter, must not sit idle until the old
// holder's TTL (a minute).
func TestHandoffBetweenClusterClientAndWrapper(t *testing.T) {
	t.Parallel() // own cluster; mostly waits for it to start
	cluster := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.ForEachShard(ctx(t), func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	off := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	direct := newLockerWith(t, c, off)
	wrapped := newLockerWith(t, interfaceWrapped{c}, off)
	for _, tc := range []struct {
		name           string
		holder, waiter *redislock.Locker
	}{
		{"cluster client releases to wrapper", direct, wrapped},
		{"wrapper releases to cluster client", wrapped, direct},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "lock:mixed-pubsub:" + tc.name
			holder := acquire(t, tc.holder, name, fence.TTL(time.Minute))
			type result struct {
				ls  fence.Lease
				err error
			}
			got := make(chan result, 1)
			wctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			go func() {
				ls, err := tc.waiter.Acquire(wctx, name, fence.Wait(time.Minute), fence.TTL(time.Minute))
				got <- result{ls, err}
			}()
			// Queued, and subscribed: a release before the subscription
			// is found by the try that follows it.
			ch := lockKey(name) + ":released"
			node, err := c.MasterForKey(ctx(t), ch) // pub/sub counts are the node's
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool {
				return c.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 &&
					node.PubSubNumSub(ctx(t), ch).Val()[ch]+node.PubSubShardNumSub(ctx(t), ch).Val()[ch] >= 1
			})
			released := time.Now()
			if err := holder.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.err != nil {
				t.Fatalf("the waiter did not get the lock granted to it %v after the release (the old holder's TTL is a minute): %v", time.Since(released).Round(time.Millisecond), r.err)
			}
			defer r.ls.Release(context.Background())
			if took := time.Since(released); took > 5*time.Second {
				t.Fatalf("the waiter got the lock %v after the release", took)
			}
		})
	}
}

// TestWaitOnInterfaceWrappedRing: a Locker on a struct embedding the
// redis.UniversalClient interface around a *redis.Ring, replica sync off
// (its acquisitions route by key through the Ring), waits for a held lock
// and gets it when it is released. Its subscription was made with
// Subscribe(ctx) and no channel, which a Ring answers with a panic ("at
// least one channel is required") on the subscription's own goroutine:
// the whole program died at the first wait.
func TestWaitOnInterfaceWrappedRing(t *testing.T) {
	ring, _ := startRing(t, 0, 0)
	l := lockerWith(t, interfaceWrapped{ring}, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:hidden-ring-wait"
	holder := acquire(t, l, name, fence.TTL(time.Minute))
	got := make(chan error, 1)
	go func() {
		ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		got <- err
	}()
	waitFor(t, func() bool { return ring.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 })
	released := time.Now()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(released); took > 5*time.Second {
		t.Fatalf("the waiter got the lock %v after the release", took)
	}
}

// TestHandoffBetweenFailoverClusterClientAndClient: one Sentinel-managed
// primary, two Lockers on one lock name, replica sync off (as two
// processes): one on a *redis.ClusterClient built as
// redis.NewFailoverClusterClient builds it (its servers are not in cluster
// mode; accepted with sync off or ReplicaSync.Replicas given), one on a
// *redis.Client (redis.NewFailoverClient's). The first published grants
// with SPUBLISH and subscribed with SSUBSCRIBE, the second with PUBLISH and
// SUBSCRIBE: neither heard the other's grants, and the lock, granted to a
// waiter, sat idle until that waiter's timer (the old holder's TTL; still
// waiting 8 s after the release here). A cluster client given its slots now
// publishes and subscribes both ways, as a Locker on a client New cannot
// identify does; a cluster client that finds its slots (a real cluster's)
// is unchanged.
func TestHandoffBetweenFailoverClusterClientAndClient(t *testing.T) {
	srv := redistest.Start(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: srv.Addr}}}}, nil
		},
	})
	t.Cleanup(func() { _ = cc.Close() })
	off := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	sharded := newLockerWith(t, cc, off)
	plain := newLockerWith(t, srv.Client(t), off)
	admin := srv.Client(t)
	for _, tc := range []struct {
		name           string
		holder, waiter *redislock.Locker
	}{
		{"cluster client releases to client", sharded, plain},
		{"client releases to cluster client", plain, sharded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "lock:failover-mixed:" + tc.name
			holder := acquire(t, tc.holder, name, fence.TTL(time.Minute))
			got := make(chan error, 1)
			wctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			go func() {
				ls, err := tc.waiter.Acquire(wctx, name, fence.Wait(time.Minute), fence.TTL(time.Minute))
				if err == nil {
					err = ls.Release(context.Background())
				}
				got <- err
			}()
			// Queued, and subscribed (either way): a release before the
			// subscription is found by the try that follows it.
			ch := lockKey(name) + ":released"
			waitFor(t, func() bool {
				return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 &&
					admin.PubSubNumSub(ctx(t), ch).Val()[ch]+admin.PubSubShardNumSub(ctx(t), ch).Val()[ch] >= 1
			})
			released := time.Now()
			if err := holder.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the waiter did not get the lock granted to it %v after the release: %v", time.Since(released).Round(time.Millisecond), err)
			}
			if took := time.Since(released); took > 5*time.Second {
				t.Fatalf("the waiter got the lock %v after the release", took)
			}
		})
	}
}

// TestWrapperWaiterAcrossSlotMove: a Locker on a struct embedding the
// redis.UniversalClient interface around a *redis.ClusterClient (replica
// sync off), which now listens both ways (SUBSCRIBE and SSUBSCRIBE on one
// connection), waits while the lock's slot moves to another master: Redis
// drops its shard subscription, it subscribes again where the slot is
// (through a cluster client that may still map the slot to the old node),
// and the grant of the release that follows, by a Locker of another
// cluster client, reaches it within moments.
func TestWrapperWaiterAcrossSlotMove(t *testing.T) {
	t.Parallel() // own cluster; mostly waits for it to start
	cluster := redistest.StartCluster(t, 3)
	newClient := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
		t.Cleanup(func() { _ = c.Close() })
		if err := c.ForEachShard(ctx(t), func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
			t.Fatal(err)
		}
		return c
	}
	hc, wc := newClient(), newClient()
	off := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	const name = "lock:wrapper-slot-move"
	lock := lockKey(name)
	holder := acquire(t, newLockerWith(t, hc, off), name, fence.TTL(time.Minute))
	waiter := newLockerWith(t, interfaceWrapped{wc}, off)
	got := make(chan error, 1)
	go func() {
		ls, err := waiter.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		got <- err
	}()
	node, err := hc.MasterForKey(ctx(t), lock)
	if err != nil {
		t.Fatal(err)
	}
	ch := lock + ":released"
	waitFor(t, func() bool {
		return hc.LLen(ctx(t), lock+":queue").Val() == 1 && node.PubSubShardNumSub(ctx(t), ch).Val()[ch] == 1
	})
	var from, to *redistest.Server
	for _, s := range cluster.Servers {
		if s.Addr == node.Options().Addr {
			from = s
		} else if to == nil {
			to = s
		}
	}
	if from == nil {
		t.Fatalf("no server at %s", node.Options().Addr)
	}
	if err := cluster.MigrateSlot(ctx(t), int(hc.ClusterKeySlot(ctx(t), lock).Val()), from, to); err != nil {
		t.Fatal(err)
	}
	// Subscribed again on the slot's new master.
	dest := redis.NewClient(&redis.Options{Addr: to.Addr})
	t.Cleanup(func() { _ = dest.Close() })
	waitFor(t, func() bool { return dest.PubSubShardNumSub(ctx(t), ch).Val()[ch] == 1 })
	released := time.Now()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(released); took > 5*time.Second {
		t.Fatalf("the waiter got the lock %v after the release", took)
	}
}
