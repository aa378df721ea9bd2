package redislock_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

func lockerWith(t testing.TB, c redis.UniversalClient, o redislock.Options) *redislock.Locker {
	t.Helper()
	l, err := redislock.New(c, &o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestArticleFailover reproduces section 2 of the article: the lock is
// written to the primary, the primary dies before the replica has it, the
// replica is promoted, and a second client takes the same lock. Without the
// replica sync check the hazard shows (two holders); with it the first
// acquisition is refused and nothing is left locked.
func TestArticleFailover(t *testing.T) {
	t.Parallel() // own servers; mostly waits on the failover and WAIT timeouts
	const name = "lock:payment:1001"
	for _, synced := range []bool{false, true} {
		t.Run(map[bool]string{false: "without-sync", true: "with-sync"}[synced], func(t *testing.T) {
			primary := redistest.Start(t)
			replica := redistest.StartReplica(t, primary)
			redistest.WaitReplicated(t, primary, 1)
			a := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: !synced}})
			// The service has been running: it has seen its replica.
			if err := fence.Run(ctx(t), a, "warm-up", func(context.Context, fence.Lease) error { return nil }); err != nil {
				t.Fatal(err)
			}

			redistest.CutLink(t, primary, replica)
			start := time.Now()
			leaseA, errA := a.Acquire(ctx(t), name, fence.TTL(30*time.Second))
			if synced {
				var nr *fence.NotReplicatedError
				if !errors.As(errA, &nr) || !errors.Is(errA, fence.ErrNotAcquired) || nr.Acked != 0 || nr.Required != 1 {
					t.Fatalf("Acquire with the replica cut off = %v, want ErrNotReplicated 0 of 1", errA)
				}
				if took := time.Since(start); took > 3*time.Second {
					t.Fatalf("refusal took %v, want about the 1 s sync timeout", took)
				}
				if n := primary.Client(t).Exists(ctx(t), lockKey(name)).Val(); n != 0 {
					t.Fatal("refused acquisition left the lock on the primary")
				}
			} else if errA != nil {
				t.Fatalf("Acquire without sync: %v", errA)
			}

			redistest.Failover(t, primary, replica)
			promoted := replica.Client(t)
			b := lockerWith(t, promoted, redislock.Options{})
			leaseB, errB := b.Acquire(ctx(t), name, fence.TTL(30*time.Second))
			if errB != nil {
				t.Fatalf("Acquire on the promoted replica: %v", errB)
			}
			defer leaseB.Release(ctx(t))
			if !synced {
				// The hazard: A still believes it holds the lock, and B holds it too.
				if leaseA.Err() != nil {
					t.Fatalf("A's lease ended (%v); the test did not reproduce two holders", leaseA.Err())
				}
				if leaseB.Token() <= leaseA.Token() {
					t.Fatalf("B's token %d is not greater than A's %d after the failover", leaseB.Token(), leaseA.Token())
				}
				t.Logf("two holders: A token %d, B token %d (the fencing token still orders them)", leaseA.Token(), leaseB.Token())
			}
		})
	}
}

func TestAckRules(t *testing.T) {
	t.Parallel() // own servers; mostly waits out WAIT timeouts
	primary := redistest.Start(t)
	r1, r2 := redistest.StartReplica(t, primary), redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 2)
	r2.Signal(syscall.SIGSTOP)
	defer r2.Signal(syscall.SIGCONT)
	_ = r1
	c := primary.Client(t)
	for _, tc := range []struct {
		acks     int
		required int // 0: the acquisition succeeds
	}{
		{0, 0}, {1, 0}, {redislock.AcksMajority, 2}, {redislock.AcksAll, 2}, {3, 3},
	} {
		l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Acks: tc.acks, Timeout: 300 * time.Millisecond}})
		lease, err := l.Acquire(ctx(t), "ack-rules", fence.TTL(time.Minute))
		var nr *fence.NotReplicatedError
		switch {
		case tc.required == 0 && err != nil:
			t.Fatalf("acks %d with one of two replicas up: %v", tc.acks, err)
		case tc.required == 0:
			if err := lease.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
		case !errors.As(err, &nr) || nr.Acked != 1 || nr.Required != tc.required:
			t.Fatalf("acks %d: %v, want NotReplicatedError 1 of %d", tc.acks, err, tc.required)
		}
	}
	if _, err := redislock.New(c, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Acks: -3}}); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("Acks -3: %v, want ErrInvalidOption", err)
	}
}

// TestUnconfirmedRenewalKeepsDeadline: once the replica is cut off, Extend
// reports ErrNotReplicated and the lease's deadline does not move.
func TestUnconfirmedRenewalKeepsDeadline(t *testing.T) {
	t.Parallel() // own servers; mostly waits out a WAIT timeout
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	// The default WAIT timeout (1 s), not 200 ms: in CI (2 CPUs, the
	// packages' tests beside it) the replica, linked and caught up, did
	// not acknowledge the Acquire within 200 ms ("not replicated: 0 of 1
	// required replicas acknowledged"). The Extend below waits it out.
	l := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: time.Second}})
	lease := acquire(t, l, "renewal", fence.TTL(5*time.Second))
	before := lease.Deadline()
	redistest.CutLink(t, primary, replica)
	err := lease.Extend(ctx(t), time.Minute)
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("Extend with the replica cut off = %v, want ErrNotReplicated", err)
	}
	if !lease.Deadline().Equal(before) {
		t.Fatalf("deadline moved from %v to %v on an unconfirmed renewal", before, lease.Deadline())
	}
	if lease.Err() != nil {
		t.Fatalf("lease ended: %v", lease.Err())
	}
}

// TestSentinelFailover: a lock taken with sync (all replicas) survives the
// primary's death: Sentinel promotes a replica, the lock is still held there,
// the holder's watchdog renews it there, and the next token is larger.
func TestSentinelFailover(t *testing.T) {
	t.Parallel() // own primary, replicas and sentinels; mostly waits out the failover
	primary := redistest.Start(t)
	r1, r2 := redistest.StartReplica(t, primary), redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 2)
	sentinels := redistest.StartSentinels(t, primary, 3)
	redistest.WaitSentinelsReady(t, sentinels, 2)

	newClient := func() *redis.Client {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinels.Master, SentinelAddrs: sentinels.Addrs()})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	sync := redislock.ReplicaSync{Acks: redislock.AcksAll}
	// A lease time well past a slow failover's (each failed election
	// waits out failover-timeout twice): a 10 s lease expired on the
	// replicas before one was promoted on CI's loaded machine.
	const ttl = 30 * time.Second
	holder := lockerWith(t, newClient(), redislock.Options{WatchdogTTL: ttl, ReplicaSync: sync})
	other := lockerWith(t, newClient(), redislock.Options{ReplicaSync: sync})
	lease := acquire(t, holder, "lock:payment:1001") // watchdog lease
	initial := lease.Deadline()

	primary.Kill()
	killed := time.Now()
	promoted := redistest.WaitFailover(t, sentinels, primary, r1, r2)
	t.Logf("sentinel promoted %s %v after the kill", promoted.Addr, time.Since(killed).Round(time.Millisecond))
	var n int64
	waitFor(t, func() bool { // an error (a timeout under load) is not an answer
		var err error
		n, err = promoted.Client(t).Exists(ctx(t), lockKey("lock:payment:1001")).Result()
		if err != nil {
			t.Logf("EXISTS on the promoted replica: %v", err)
		}
		return err == nil
	})
	if n != 1 {
		t.Fatalf("the promoted replica does not have the lock (promoted %v after the kill; the lease's deadline was %v after the kill)",
			time.Since(killed).Round(time.Millisecond), initial.Sub(killed).Round(time.Millisecond))
	}
	// The other client, once it has found the new primary, is refused.
	waitFor(t, func() bool {
		_, err := other.Acquire(ctx(t), "lock:payment:1001")
		return errors.Is(err, fence.ErrHeld)
	})
	// The holder's watchdog renews on the new primary: its first renewal
	// is due a third of the lease time after the acquisition, after the
	// kill, so a deadline that moved was renewed there.
	for limit := time.Now().Add(ttl); !lease.Deadline().After(initial); {
		if time.Now().After(limit) {
			t.Fatalf("the holder's deadline did not move within %v of the failover: %v", ttl, lease.Err())
		}
		time.Sleep(5 * time.Millisecond) // a poll with a deadline
	}
	if lease.Err() != nil {
		t.Fatalf("lease lost in the failover: %v", lease.Err())
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	// Sentinel attaches the other replica to the promoted one only now and
	// then, and on a loaded machine its first sync can outlast a WAIT's
	// second (a CI run: "0 of 1 required replicas acknowledged"): the
	// next acquisition is taken once it is attached, and an
	// ErrNotReplicated, a "try again later", is tried again.
	redistest.WaitReplicated(t, promoted, 1)
	var next fence.Lease
	waitFor(t, func() bool {
		var err error
		next, err = other.Acquire(ctx(t), "lock:payment:1001", fence.TTL(time.Minute))
		if err != nil && !errors.Is(err, fence.ErrNotReplicated) {
			t.Fatal(err)
		}
		return err == nil
	})
	t.Cleanup(func() { _ = next.Release(context.Background()) })
	if next.Token() <= lease.Token() {
		t.Fatalf("token after failover %d, want > %d", next.Token(), lease.Token())
	}
}

func TestClusterConformance(t *testing.T) {
	t.Parallel() // own cluster; the suite mostly waits on leases and budgets (1 s slack)
	cluster := redistest.StartCluster(t, 3)
	newClient := func(t testing.TB) *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	admin := newClient(t)
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New: func(t testing.TB) fence.Locker {
			return newLockerWith(t, newClient(t), redislock.Options{WatchdogTTL: conformanceWatchdogTTL})
		},
		Remove:      func(t testing.TB, name string) { admin.Del(context.Background(), lockKey(name)) },
		WatchdogTTL: conformanceWatchdogTTL,
	})

	t.Run("NamesOverSlots", func(t *testing.T) {
		l := newLocker(t, admin)
		nodes := map[string]bool{}
		var leases []fence.Lease
		for i := range 64 {
			name := "lock:payment:" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + string(rune('0'+i/26))
			lease := acquire(t, l, name, fence.TTL(time.Minute))
			leases = append(leases, lease)
			node, err := admin.MasterForKey(ctx(t), lockKey(name))
			if err != nil {
				t.Fatal(err)
			}
			nodes[node.Options().Addr] = true
		}
		if len(nodes) != 3 {
			t.Fatalf("64 names landed on %d nodes, want all 3", len(nodes))
		}
		for _, lease := range leases {
			if err := lease.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestConformanceSynced runs the conformance suite with replica sync doing
// real work: every acquisition and renewal waits for the replica.
func TestConformanceSynced(t *testing.T) {
	t.Parallel() // own servers; the suite mostly waits on leases and budgets (1 s slack)
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New: func(t testing.TB) fence.Locker {
			return lockerWith(t, primary.Client(t), redislock.Options{WatchdogTTL: conformanceWatchdogTTL, ReplicaSync: redislock.ReplicaSync{Replicas: 1}})
		},
		Remove:      func(t testing.TB, name string) { admin.Del(context.Background(), lockKey(name)) },
		WatchdogTTL: conformanceWatchdogTTL,
	})
}
