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

// TestFailoverClusterClientWithoutShardedPubSub: an ACL user without
// SPUBLISH and SSUBSCRIBE (written before Redis 7, say) on a cluster client
// given its slots (redis.NewFailoverClusterClient's kind), which publishes
// and subscribes both ways: its SSUBSCRIBE refused, it goes on with
// SUBSCRIBE; its grants' SPUBLISH refused, the PUBLISH before it stands.
// Handoffs to and from a Locker of a plain client of the same user take
// moments, and from one such Locker to another.
func TestFailoverClusterClientWithoutShardedPubSub(t *testing.T) {
	srv := redistest.Start(t)
	if err := srv.Client(t).Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-spublish", "-ssubscribe").Err(); err != nil {
		t.Fatal(err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Username: "app", Password: "pw",
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: srv.Addr}}}}, nil
		},
	})
	t.Cleanup(func() { _ = cc.Close() })
	pc := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
	t.Cleanup(func() { _ = pc.Close() })
	off := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	failover, failover2, plain := newLockerWith(t, cc, off), newLockerWith(t, cc, off), newLockerWith(t, pc, off)
	admin := srv.Client(t)
	for _, tc := range []struct {
		name           string
		holder, waiter *redislock.Locker
	}{
		{"client to cluster client", plain, failover},
		{"cluster client to client", failover, plain},
		{"cluster client to cluster client", failover, failover2},
	} {
		name := "lock:failover-acl:" + tc.name
		holder := acquire(t, tc.holder, name, fence.TTL(time.Minute))
		got := make(chan error, 1)
		wctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		go func() {
			ls, err := tc.waiter.Acquire(wctx, name, fence.Wait(time.Minute), fence.TTL(time.Minute))
			if err == nil {
				err = ls.Release(context.Background())
			}
			got <- err
		}()
		ch := lockKey(name) + ":released"
		waitFor(t, func() bool {
			return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 && admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1
		})
		released := time.Now()
		if err := holder.Release(ctx(t)); err != nil {
			t.Fatalf("%s: Release: %v", tc.name, err)
		}
		err := <-got
		cancel()
		if err != nil {
			t.Fatalf("%s: the waiter did not get the lock %v after the release: %v", tc.name, time.Since(released).Round(time.Millisecond), err)
		}
		if took := time.Since(released); took > 5*time.Second {
			t.Fatalf("%s: the waiter got the lock %v after the release", tc.name, took)
		}
	}
}
