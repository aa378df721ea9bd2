package redislock_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// staleReplica cuts replica off from primary while it keeps answering: it
// cannot authenticate to its primary any more (masterauth set, the
// primary has no password) and its link is killed, so that it never sees
// the primary's next writes and serves what it had.
func staleReplica(t *testing.T, primary, replica *redistest.Server) {
	t.Helper()
	admin, radmin := primary.Client(t), replica.Client(t)
	if err := radmin.ConfigSet(ctx(t), "masterauth", "wrong").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ClientKillByFilter(ctx(t), "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return strings.Contains(radmin.Info(ctx(t), "replication").Val(), "master_link_status:down") &&
			!strings.Contains(admin.Info(ctx(t), "replication").Val(), "ip=127.0.0.1,port="+strings.Split(replica.Addr, ":")[1]+",")
	})
}

// checkStatus reads Status of name, held by lease, 20 times (a client
// routing reads at random hits the stale replica in one of them all but
// once in a million) and then once after lease's Release.
func checkStatus(t *testing.T, l *redislock.Locker, name string, lease fence.Lease) {
	t.Helper()
	for i := range 20 {
		st, err := l.Status(ctx(t), name)
		if err != nil || !st.Held || st.TTL <= 0 || st.TTL > time.Minute || st.LastToken != lease.Token() {
			t.Fatalf("Status %d of the lock just acquired (token %d, TTL 1m) = %+v, %v; want held with that token", i, lease.Token(), st, err)
		}
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if st, err := l.Status(ctx(t), name); err != nil || st.Held || st.LastToken != lease.Token() {
		t.Fatalf("Status after Release = %+v, %v; want free, last token %d", st, err, lease.Token())
	}
}

// TestStatusOnReplicaRoutingClient: on go-redis clients that send
// read-only commands to replicas, Status read the lock's PTTL and its
// token record (a pipelined PTTL and GET, both read-only) on a replica.
// With the replica cut off from its primary, the lease just acquired was
// reported free with last token 0: on a cluster client given its slots
// (as redis.NewFailoverClusterClient builds one) with ReadOnly,
// "Held:false TTL:0s LastToken:0" (with RouteRandomly the same, in most
// of 20 reads), and on a real cluster's client with ReadOnly likewise.
// Status now reads both in a script, which go-redis sends to the primary.
//
// The Lockers have replica sync off: a cluster client given its slots
// cannot read replica counts (see TestStatusReplicaCountsUnknown).
func TestStatusOnReplicaRoutingClient(t *testing.T) {
	off := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	t.Run("ClusterSlots", func(t *testing.T) {
		primary := redistest.Start(t)
		replica := redistest.StartReplica(t, primary)
		redistest.WaitReplicated(t, primary, 1)
		staleReplica(t, primary, replica)
		for _, route := range []struct {
			name string
			set  func(*redis.ClusterOptions)
		}{
			{"ReadOnly", func(o *redis.ClusterOptions) { o.ReadOnly = true }},
			{"RouteRandomly", func(o *redis.ClusterOptions) { o.RouteRandomly = true }},
		} {
			t.Run(route.name, func(t *testing.T) {
				l := newLockerWith(t, failoverClusterClient(t, route.set, primary.Addr, replica.Addr), off)
				name := "lock:status-route:" + route.name
				checkStatus(t, l, name, acquire(t, l, name, fence.TTL(time.Minute)))
			})
		}
	})
	t.Run("Cluster", func(t *testing.T) {
		c := redistest.StartClusterWithReplicas(t, 3, 1)
		for i, r := range c.Replicas {
			// The replicas follow the masters in order (redis-cli
			// --cluster create); find each one's master by its own word.
			var master *redistest.Server
			info := r.Client(t).Info(ctx(t), "replication").Val()
			for _, m := range c.Servers {
				if strings.Contains(info, "master_port:"+strings.Split(m.Addr, ":")[1]+"\r") {
					master = m
				}
			}
			if master == nil {
				t.Fatalf("replica %d (%s): no master of the cluster in %q", i, r.Addr, info)
			}
			staleReplica(t, master, r)
		}
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ReadOnly: true})
		t.Cleanup(func() { _ = cc.Close() })
		l := newLockerWith(t, cc, off)
		for i := range 3 { // names on different masters, likely
			name := fmt.Sprintf("lock:status-route:cluster%d", i)
			checkStatus(t, l, name, acquire(t, l, name, fence.TTL(time.Minute)))
		}
	})
}

// TestStatusReplicaCountsUnknown: Status reads the lock, then the replica
// counts of its primary. On a cluster client given its slots (as
// redis.NewFailoverClusterClient builds one), whose servers are not in
// cluster mode, the counts cannot be read (no CLUSTER NODES), and with
// replica sync off Status failed altogether: "redislock: status
// \"lock:status-counts\": redislock: the *redis.ClusterClient's servers
// are not in cluster mode ...". The lock's state, which it had read, is
// what the caller asked for: it is returned, and the counts' error is in
// Status.ReplicasErr.
func TestStatusReplicaCountsUnknown(t *testing.T) {
	primary := redistest.Start(t)
	l := newLockerWith(t, failoverClusterClient(t, nil, primary.Addr), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:status-counts"
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	st, err := l.Status(ctx(t), name)
	if err != nil || !st.Held || st.LastToken != lease.Token() {
		t.Fatalf("Status = %+v, %v; want held, token %d, no error", st, err, lease.Token())
	}
	if !errors.Is(st.ReplicasErr, fence.ErrInvalidOption) || st.Replicas != (redislock.ReplicaCounts{}) {
		t.Fatalf("Status.Replicas = %+v, ReplicasErr = %v; want zero counts and the error matching ErrInvalidOption", st.Replicas, st.ReplicasErr)
	}
	// Where the counts can be read, ReplicasErr is nil.
	plain := newLockerWith(t, primary.Client(t), redislock.Options{})
	if st, err := plain.Status(ctx(t), name); err != nil || st.ReplicasErr != nil || !st.Held {
		t.Fatalf("Status on a plain client = %+v, %v; want held, counts read", st, err)
	}
}

// TestStatusOnPrimaryRefusingWrites: Status reads the lock on a primary that
// refuses writes, for lack of replicas (min-replicas-to-write: NOREPLICAS) or
// after a failed save (MISCONF): that is when an operator runs `fence
// status`. state.lua, declared with flags (#!lua flags=allow-oom) so that a
// replica would refuse it, was refused there as a write: "NOREPLICAS Not
// enough good replicas to write." for a lease taken before the replica left.
func TestStatusOnPrimaryRefusingWrites(t *testing.T) {
	primary := redistest.Start(t)
	admin := primary.Client(t)
	l := newLockerWith(t, admin, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:status-noreplicas"
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	if err := admin.ConfigSet(ctx(t), "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Set(ctx(t), "probe", "1", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOREPLICAS") {
		t.Fatalf("a write on the primary without replicas = %v; want NOREPLICAS (the premise)", err)
	}
	st, err := l.Status(ctx(t), name)
	if err != nil || !st.Held || st.LastToken != lease.Token() {
		t.Fatalf("Status on a primary refusing writes (NOREPLICAS) = %+v, %v; want held, token %d", st, err, lease.Token())
	}
}
