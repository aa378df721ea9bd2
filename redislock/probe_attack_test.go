package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestHiddenRingGrows: the opaque-client probe's answer is kept for the
// Locker's life. A struct embedding the redis.UniversalClient interface
// around a *redis.Ring of one shard passes it (one server), and the Ring
// then gets a second shard (Ring.SetAddrs, as a deployment that grows
// does): the lock names on the new shard go there, the pipelined key-less
// WAIT goes to the shard the Ring hashes the command's name to, and an
// acquisition on a shard whose replica is paused must be refused
// (fence.ErrNotReplicated or the *redislock.HiddenClusterError), never
// confirmed. Before: the one-server answer was kept for the Locker's life,
// and 5 of 10 were confirmed (those on the shard the WAIT did not go to).
// Now an answer of one server is asked again when it is 10 s old, as the
// expected replica count is re-read: the Locker's clock is moved on by that
// after the Ring grows. Within those 10 s the old answer still holds (see
// HiddenClusterError).
func TestHiddenRingGrows(t *testing.T) {
	var shards []*ringShard
	for i := range 2 {
		s := &ringShard{name: []string{"shard0", "shard1"}[i], primary: redistest.Start(t)}
		s.replicas = append(s.replicas, redistest.StartReplica(t, s.primary))
		redistest.WaitReplicated(t, s.primary, 1)
		shards = append(shards, s)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"shard0": shards[0].primary.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	l := lockerWith(t, interfaceWrapped{ring}, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
	if err := tryOnce(t, l, "lock:grow"); err != nil {
		t.Fatalf("Acquire on a one-shard Ring behind an interface = %v; want it taken (one server)", err)
	}
	var ahead atomic.Int64
	redislock.SetClock(l, func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) })
	ring.SetAddrs(map[string]string{"shard0": shards[0].primary.Addr, "shard1": shards[1].primary.Addr})
	ahead.Store(int64(10 * time.Second))
	nameOn(t, ring, shards[1], "grow") // the Ring now uses both
	confirmed := 0
	for _, s := range shards {
		name := nameOn(t, ring, s, "grow")
		resume := s.replicas[0].Pause(t)
		confirmed += confirmedOf(t, l, name, 5, s.name+", ")
		resume()
	}
	if confirmed > 0 {
		t.Errorf("%d of 10 acquisitions through an interface wrapper of a Ring that grew to two shards confirmed with the lock shard's replica paused; want each refused", confirmed)
	}
}

// TestProbeHungServer: the probe of an opaque client runs inside the
// acquisition's call, and its server may hang. Concurrent first Acquires
// with a 300 ms deadline, on a wrapper of a plain client whose server is
// paused, all end by their deadline (not acquired), one probe at a time
// notwithstanding; the failed question is not kept: with the server back,
// the next Acquire asks again and takes the lock, replica sync working.
func TestProbeHungServer(t *testing.T) {
	primary := redistest.Start(t)
	c := primary.Client(t)
	probes := infoCounter()
	c.AddHook(probes)
	l := lockerWith(t, interfaceWrapped{c}, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
	resume := primary.Pause(t)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	took := make([]time.Duration, len(errs))
	for i := range errs {
		wg.Go(func() {
			cx, cancel := context.WithTimeout(ctx(t), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			lease, err := l.Acquire(cx, fmt.Sprintf("lock:hung:%d", i), fence.TTL(time.Minute))
			took[i] = time.Since(start)
			if err == nil {
				_ = lease.Release(ctx(t))
			}
			errs[i] = err
		})
	}
	wg.Wait()
	resume()
	for i, err := range errs {
		if err == nil {
			t.Errorf("Acquire %d on a paused server: acquired", i)
		}
		if took[i] > 1500*time.Millisecond {
			t.Errorf("Acquire %d with a 300 ms deadline on a paused server took %v (%v)", i, took[i], err)
		}
	}
	if err := tryOnce(t, l, "lock:hung"); err != nil {
		t.Fatalf("Acquire with the server back = %v; want it taken (a failed question is not kept)", err)
	}
	if err := l.ReplicaSyncRefusal(); err != nil {
		t.Errorf("ReplicaSyncRefusal = %v; want nil", err)
	}
	if n := probes.n.Load(); n < 1 || n > 2 {
		t.Errorf("asked %d times; want the question once during the pause (one at a time) and at most once more", n)
	}
}

// TestProbeACLWithoutInfo: a common ACL, +@all -@dangerous, forbids INFO
// (a @dangerous command). Replica sync reads the expected count with INFO,
// so such a user sets ReplicaSync.Replicas, and then an acquisition needs
// only the scripts and WAIT. The probe of an opaque client asks INFO too,
// and fails every time: "ask the server(s) of a
// redislock_test.interfaceWrapped whether it is a cluster node or several
// servers (replica sync must know): NOPERM this user has no permissions to
// run the 'info' command", where the *redis.Client itself takes the lock
// (and an interface wrapper took it before the probe). Fail-closed, so not
// unsafe, but refused. Now the probe asks without INFO when INFO is
// refused (NOPERM): HELLO's mode for a cluster node, and a mark that the
// first of its scripts sets on each server they reach (undeclared, so not
// routed by it) for one server or several; the wrapper takes the lock,
// and with the replica paused it is refused as not replicated.
func TestProbeACLWithoutInfo(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	if err := admin.Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-@dangerous").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: primary.Addr, Username: "app", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 200 * time.Millisecond}}
	if err := tryOnce(t, lockerWith(t, c, opts), "lock:acl"); err != nil {
		t.Fatalf("Acquire on the *redis.Client of an ACL user without @dangerous, Replicas 1 = %v", err)
	}
	l := lockerWith(t, interfaceWrapped{c}, opts)
	if err := tryOnce(t, l, "lock:acl"); err != nil {
		t.Errorf("Acquire on an interface wrapper of the same client = %v; the *redis.Client itself takes it", err)
	}
	refusedWhilePaused(t, l, replica, "lock:acl", "an interface wrapper, ACL without INFO")
}

// aclNoInfo gives the servers a user app (password pw) with +@all
// -@dangerous: no INFO, ROLE or CLIENT INFO.
func aclNoInfo(t *testing.T, servers ...*redistest.Server) {
	t.Helper()
	for _, s := range servers {
		if err := s.Client(t).Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-@dangerous").Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestProbeACLWithoutInfoSpread: the probe without INFO (see
// TestProbeACLWithoutInfo) still tells what the probe with it does. An
// interface wrapper of a Ring of two shards, or of a cluster client, of
// an ACL user without INFO is refused with a *redislock.HiddenClusterError
// (nothing taken), and one of a plain client that speaks RESP2 (HELLO's
// reply a flat list) takes the lock.
func TestProbeACLWithoutInfoSpread(t *testing.T) {
	t.Parallel() // own servers and cluster; mostly waits on the cluster's start
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 200 * time.Millisecond}}
	refused := func(t *testing.T, l *redislock.Locker, what string) {
		t.Helper()
		for i := range 3 {
			err := tryOnce(t, l, fmt.Sprintf("lock:acl-spread:%d", i))
			var hidden *redislock.HiddenClusterError
			if !errors.As(err, &hidden) {
				t.Errorf("%s, ACL without INFO: Acquire %d = %v; want a *redislock.HiddenClusterError", what, i, err)
			} else if i == 0 {
				t.Logf("%s: refused: %s", what, hidden.Detail)
			}
		}
	}
	t.Run("ring", func(t *testing.T) {
		a, b := redistest.Start(t), redistest.Start(t)
		aclNoInfo(t, a, b)
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}, Username: "app", Password: "pw"})
		t.Cleanup(func() { _ = ring.Close() })
		refused(t, lockerWith(t, interfaceWrapped{ring}, opts), "an interface wrapper of a Ring of two shards")
	})
	t.Run("cluster", func(t *testing.T) {
		cluster := redistest.StartCluster(t, 3)
		aclNoInfo(t, cluster.Servers...)
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), Username: "app", Password: "pw"})
		t.Cleanup(func() { _ = c.Close() })
		refused(t, lockerWith(t, interfaceWrapped{c}, opts), "an interface wrapper of a cluster client")
	})
	t.Run("resp2", func(t *testing.T) {
		primary := redistest.Start(t)
		replica := redistest.StartReplica(t, primary)
		redistest.WaitReplicated(t, primary, 1)
		aclNoInfo(t, primary)
		c := redis.NewClient(&redis.Options{Addr: primary.Addr, Username: "app", Password: "pw", Protocol: 2})
		t.Cleanup(func() { _ = c.Close() })
		l := lockerWith(t, interfaceWrapped{c}, opts)
		if err := tryOnce(t, l, "lock:acl-resp2"); err != nil {
			t.Fatalf("Acquire on an interface wrapper of a RESP2 client of an ACL user without INFO = %v", err)
		}
		refusedWhilePaused(t, l, replica, "lock:acl-resp2", "an interface wrapper of a RESP2 client, ACL without INFO")
	})
}

// TestClusterRoutingOptions: a *redis.ClusterClient that reads from
// replicas (ReadOnly, RouteByLatency, RouteRandomly), or takes its slot map
// from ClusterSlots (a cluster behind NAT), must still run the script and
// its WAIT on the slot master's own connection: taken with the replicas
// up, refused (fence.ErrNotReplicated) with the master's replica paused,
// never refused as a cluster that is not one.
func TestClusterRoutingOptions(t *testing.T) {
	t.Parallel() // own cluster; mostly waits on the cluster and the paused replica
	cluster := redistest.StartClusterWithReplicas(t, 3, 1)
	seed := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = seed.Close() })
	const name = "lock:routing"
	_, replica := masterAndReplica(t, cluster, seed, name)
	//lint:ignore SA1019 ClusterOptions.ClusterSlots wants CLUSTER SLOTS's reply, as a NAT'd deployment's function gives it
	slots, err := seed.ClusterSlots(ctx(t)).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		opt  redis.ClusterOptions
	}{
		{"ReadOnly", redis.ClusterOptions{ReadOnly: true}},
		{"RouteByLatency", redis.ClusterOptions{RouteByLatency: true}},
		{"RouteRandomly", redis.ClusterOptions{RouteRandomly: true}},
		{"ClusterSlots", redis.ClusterOptions{ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { return slots, nil }}},
	} {
		o := tc.opt
		o.Addrs = cluster.Addrs()
		c := redis.NewClusterClient(&o)
		t.Cleanup(func() { _ = c.Close() })
		l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
		for i := range 3 {
			if err := tryOnce(t, l, name); err != nil {
				t.Fatalf("%s: Acquire %d with the replicas up = %v", tc.what, i, err)
			}
		}
		resume := replica.Pause(t)
		for i := range 5 {
			if err := tryOnce(t, l, name); !errors.Is(err, fence.ErrNotReplicated) {
				t.Errorf("%s: Acquire %d with the slot master's replica paused = %v; want fence.ErrNotReplicated", tc.what, i, err)
			}
		}
		resume()
		if err := l.ReplicaSyncRefusal(); err != nil {
			t.Errorf("%s: ReplicaSyncRefusal = %v; want nil", tc.what, err)
		}
	}
}

// TestHiddenFailoverClusterClient: a NewFailoverClusterClient-style client
// (servers not in cluster mode, the primary and its replica as one slot
// range, reading from replicas) hidden behind an interface wrapper: the
// probe sees one server that is no cluster node, and replica sync goes on
// through the wrapper. Its WAIT must then count the primary's replica:
// taken with it up, fence.ErrNotReplicated with it paused.
func TestHiddenFailoverClusterClient(t *testing.T) {
	t.Parallel() // own servers; mostly waits on WAITs and the paused replica
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	c := redis.NewClusterClient(&redis.ClusterOptions{
		ReadOnly:      true,
		RouteRandomly: true,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: primary.Addr}, {Addr: replica.Addr}}}}, nil
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, interfaceWrapped{c}, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
	for i := range 5 {
		err := tryOnce(t, l, fmt.Sprintf("lock:hfc:%d", i))
		var hidden *redislock.HiddenClusterError
		if err != nil && !errors.As(err, &hidden) {
			t.Fatalf("Acquire %d = %v; want taken or a *redislock.HiddenClusterError", i, err)
		}
		if hidden != nil {
			return // refused: nothing to confirm unchecked
		}
	}
	for i := range 3 {
		refusedWhilePaused(t, l, replica, fmt.Sprintf("lock:hfc:%d", i), "an interface wrapper of a failover cluster client")
	}
}

// optionsWrapped embeds the redis.UniversalClient interface and reports
// *redis.Options of its own: as a program's wrapper of
// redis.NewUniversalClient may, giving UniversalOptions.Simple().
type optionsWrapped struct {
	redis.UniversalClient
	o *redis.Options
}

func (w optionsWrapped) Options() *redis.Options { return w.o }

// TestOptionsReportingClusterWrapper: a type reporting *redis.Options was
// taken for a single server's client, without asking it, whatever it
// holds. A wrapper of redis.NewUniversalClient around a cluster (several
// Addrs make it a *redis.ClusterClient) that reports
// UniversalOptions.Simple() then sends the key-less WAIT to a master of
// the cluster's choosing: with the lock slot master's replica paused,
// acquisitions must be refused (fence.ErrNotReplicated or a
// *redislock.HiddenClusterError), never confirmed.
func TestOptionsReportingClusterWrapper(t *testing.T) {
	t.Parallel() // own cluster; mostly waits on it and the paused replica
	cluster := redistest.StartClusterWithReplicas(t, 3, 1)
	uo := &redis.UniversalOptions{Addrs: cluster.Addrs()}
	u := redis.NewUniversalClient(uo)
	t.Cleanup(func() { _ = u.Close() })
	cc, ok := u.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("NewUniversalClient with %d Addrs gave a %T", len(uo.Addrs), u)
	}
	const name = "lock:opts-wrapped"
	_, replica := masterAndReplica(t, cluster, cc, name)
	l := lockerWith(t, optionsWrapped{u, uo.Simple()}, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
	resume := replica.Pause(t)
	defer resume()
	if confirmed := confirmedOf(t, l, name, 5, ""); confirmed > 0 {
		t.Errorf("%d of 5 acquisitions through a wrapper reporting *redis.Options around a cluster client confirmed with the slot master's replica paused; want each refused", confirmed)
	}
}

// confirmedOf tries n acquisitions of name on l, each released, and counts
// those confirmed; the others must be refused as not replicated or as a
// hidden cluster (label starts the error's text).
func confirmedOf(t *testing.T, l *redislock.Locker, name string, n int, label string) (confirmed int) {
	t.Helper()
	for i := range n {
		err := tryOnce(t, l, name)
		var hidden *redislock.HiddenClusterError
		switch {
		case err == nil:
			confirmed++
		case errors.Is(err, fence.ErrNotReplicated), errors.As(err, &hidden):
		default:
			t.Errorf("%sAcquire %d = %v; want fence.ErrNotReplicated or a *redislock.HiddenClusterError", label, i, err)
		}
	}
	return confirmed
}
