package fencerueidis_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// subscribed returns how many connections of the server admin speaks to
// have a channel subscription (sub= above zero in CLIENT LIST).
func subscribed(t *testing.T, admin *redis.Client) int {
	t.Helper()
	list, err := admin.ClientList(ctx(t)).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		for _, f := range strings.Fields(line) {
			if k, v, _ := strings.Cut(f, "="); k == "sub" && v != "0" {
				n++
			}
		}
	}
	return n
}

// TestWaiterOnReplicaRoutingClient: a rueidis client that sends its
// read-only commands to replicas, as rueidis's README shows
// (Standalone.ReplicaAddress with SendToReplicas: cmd.IsReadOnly()), for
// the user's reads. rueidis's SUBSCRIBE is read-only, so the waiter's
// subscription went to the replica: a replica that stalls (a long fork, a
// partition from its primary, a full resync) did not pass the holder's
// release on, and the waiter (20 s budget) sat on a free lock until the
// test's 30 s context ended, where a plain client's waiter is woken at
// once; the same on rueidis's Sentinel client with SendToReplicas. With
// replica sync off, the lock itself needs nothing from the replica. The
// waiter must be woken within seconds of the release.
func TestWaiterOnReplicaRoutingClient(t *testing.T) {
	readOnly := func(cmd rueidis.Completed) bool { return cmd.IsReadOnly() }
	for _, resp2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("resp2=%v", resp2), func(t *testing.T) {
			primary := redistest.Start(t)
			replica := redistest.StartReplica(t, primary)
			redistest.WaitReplicated(t, primary, 1)
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{primary.Addr}, AlwaysRESP2: resp2, DisableCache: resp2,
				Standalone: rueidis.StandaloneOption{ReplicaAddress: []string{replica.Addr}}, SendToReplicas: readOnly})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			waiterOnRoutedReplica(t, primary, replica, c)
		})
	}
	// rueidis's Sentinel client with SendToReplicas: the same.
	t.Run("sentinel", func(t *testing.T) {
		primary := redistest.Start(t)
		replica := redistest.StartReplica(t, primary)
		redistest.WaitReplicated(t, primary, 1)
		sentinels := redistest.StartSentinels(t, primary, 1)
		redistest.WaitSentinelsReady(t, sentinels, 1)
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: sentinels.Addrs(), Sentinel: rueidis.SentinelOption{MasterSet: sentinels.Master},
			SendToReplicas: readOnly})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		waiterOnRoutedReplica(t, primary, replica, c)
	})
}

func waiterOnRoutedReplica(t *testing.T, primary, replica *redistest.Server, c rueidis.Client) {
	admin, radmin := primary.Client(t), replica.Client(t)
	r := newLocker(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	g, err := redislock.New(admin, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	held, err := g.Acquire(ctx(t), "routed", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		b, err := r.Acquire(ctx(t), "routed", fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = b.Release(ctx(t))
		}
		got <- err
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey("routed")+":queue").Val() == 1 })
	waitFor(t, func() bool { return subscribed(t, admin)+subscribed(t, radmin) > 0 })
	t.Logf("subscribed connections: %d on the primary, %d on the replica", subscribed(t, admin), subscribed(t, radmin))
	replica.Pause(t) // stalled for the rest of the test
	released := time.Now()
	if err := held.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v, %v after the release", err, time.Since(released).Round(time.Millisecond))
		}
		t.Logf("woken %v after the release", time.Since(released).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatalf("the waiter was not woken 10 s after the release (the lock is free)")
	}
}

// TestStatusOnReplicaRoutingClient: Status through a client that sends
// read-only commands to a replica (as in TestWaiterOnReplicaRoutingClient)
// read the lock's PTTL and token record there, while its replica counts
// came from the primary: with the replica cut from its primary (it can no
// longer authenticate there; it goes on serving its stale data, Redis's
// default), the caller's own lease, just acquired, was reported as
// Held false, LastToken 0. Status must say what the primary holds.
func TestStatusOnReplicaRoutingClient(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin, radmin := primary.Client(t), replica.Client(t)
	if err := radmin.ConfigSet(ctx(t), "masterauth", "wrong").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ClientKillByFilter(ctx(t), "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(admin.Info(ctx(t), "replication").Val(), "connected_slaves:0") })
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{primary.Addr},
		Standalone:     rueidis.StandaloneOption{ReplicaAddress: []string{replica.Addr}},
		SendToReplicas: func(cmd rueidis.Completed) bool { return cmd.IsReadOnly() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	r := newLocker(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	ls, err := r.Acquire(ctx(t), "status", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.Status(ctx(t), "status")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.TTL <= 0 || st.TTL > time.Minute || st.LastToken != ls.Token() {
		t.Errorf("Status of the lock just acquired (token %d, TTL 1m) = %+v, want held with that token", ls.Token(), st)
	}
	if err := ls.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if st, err = r.Status(ctx(t), "status"); err != nil || st.Held || st.LastToken != ls.Token() {
		t.Errorf("Status after Release = %+v, %v, want not held, token %d", st, err, ls.Token())
	}
}

// TestUnsubscribeOnReplicaRoutingClient: a client that sends read-only
// commands to two replicas (Standalone.ReplicaAddress, SendToReplicas:
// cmd.IsReadOnly()). A waiter's subscriptions through the client's
// Receive (the closing watch of a dedicated subscription) went to one
// replica picked at random, and the UNSUBSCRIBE sent when the waiter left
// to another picked again: of 10 names waited on one after the other, 3
// to 6 stayed subscribed on the replicas for the connections' life. Every
// subscription must end within seconds of its waiter leaving.
func TestUnsubscribeOnReplicaRoutingClient(t *testing.T) {
	for _, resp2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("resp2=%v", resp2), func(t *testing.T) {
			primary := redistest.Start(t)
			r1, r2 := redistest.StartReplica(t, primary), redistest.StartReplica(t, primary)
			redistest.WaitReplicated(t, primary, 2)
			admin := primary.Client(t)
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{primary.Addr}, AlwaysRESP2: resp2, DisableCache: resp2,
				Standalone:     rueidis.StandaloneOption{ReplicaAddress: []string{r1.Addr, r2.Addr}},
				SendToReplicas: func(cmd rueidis.Completed) bool { return cmd.IsReadOnly() }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			off := redislock.ReplicaSync{Disabled: true}
			r := newLocker(t, c, redislock.Options{ReplicaSync: off})
			g, err := redislock.New(admin, &redislock.Options{ReplicaSync: off})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 10 {
				name := fmt.Sprintf("unsub%d", i)
				held, err := g.Acquire(ctx(t), name, fence.TTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				got := make(chan error, 1)
				go func() {
					b, err := r.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
					if err == nil {
						err = b.Release(ctx(t))
					}
					got <- err
				}()
				waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 })
				waitFor(t, func() bool { return subscribed(t, admin) > 0 })
				if err := held.Release(ctx(t)); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatal(err)
				}
			}
			servers := []*redistest.Server{primary, r1, r2}
			left := func() (all []string) {
				for _, s := range servers {
					all = append(all, s.Client(t).PubSubChannels(ctx(t), "*").Val()...)
				}
				return all
			}
			deadline := time.Now().Add(5 * time.Second)
			for len(left()) > 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond) // polling with a deadline
			}
			if l := left(); len(l) > 0 {
				t.Errorf("%d channels still subscribed 5 s after the last waiter left: %v", len(l), l)
			}
		})
	}
}
