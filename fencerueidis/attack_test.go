package fencerueidis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencerueidis"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// TestSubscriptionKilled: a waiter whose subscription connection is killed
// (CLIENT KILL of its connection) and whose holder releases before it could
// subscribe again must still be woken within seconds, not wait out the
// holder's minute-long TTL nor its own 20 s budget.
func TestSubscriptionKilled(t *testing.T) {
	// RESP2: rueidis subscribes on a connection of its own, and its
	// Receive retried that connection dead without subscribing again: the
	// waiter waited its whole budget until Subscribe moved to a dedicated
	// client there.
	for _, resp2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("resp2=%v", resp2), func(t *testing.T) {
			srv := redistest.Start(t)
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, AlwaysRESP2: resp2, DisableCache: resp2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			subscriptionKilled(t, srv, newLocker(t, c, redislock.Options{}))
		})
	}
	// The same attack on redislock's own go-redis path, for comparison.
	t.Run("go-redis", func(t *testing.T) {
		srv := redistest.Start(t)
		r, err := redislock.New(srv.Client(t), &redislock.Options{WatchdogTTL: watchdogTTL})
		if err != nil {
			t.Fatal(err)
		}
		subscriptionKilled(t, srv, r)
	})
}

func subscriptionKilled(t *testing.T, srv *redistest.Server, r fence.Locker) {
	admin := srv.Client(t)
	g, err := redislock.New(admin, nil)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		held, err := g.Acquire(ctx(t), "shared", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		var b fence.Lease
		go func() {
			var err error
			b, err = r.Acquire(ctx(t), "shared", fence.Wait(20*time.Second), fence.TTL(time.Minute))
			got <- err
		}()
		deadline := time.Now().Add(10 * time.Second)
		for admin.PubSubNumSub(ctx(t), "fence:{shared}:released").Val()["fence:{shared}:released"] == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the waiter never subscribed")
			}
			time.Sleep(5 * time.Millisecond) // polling with a deadline
		}
		if killed := killSubscribers(t, admin); killed == 0 {
			t.Fatal("no subscribed connection to kill")
		}
		start := time.Now()
		if err := held.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("round %d: waiter after the kill and release: %v", round, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the waiter was not woken 10 s after its subscription was killed and the lock released", round)
		}
		t.Logf("round %d: woken after %v", round, time.Since(start).Round(time.Millisecond))
		if err := b.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
		// The waiter's subscription ends in the background after it
		// leaves (or lingers on a shared RESP3 connection): clear them all,
		// so that the next round's subscriber is the next waiter's.
		deadline = time.Now().Add(10 * time.Second)
		for killSubscribers(t, admin) > 0 || admin.PubSubNumSub(ctx(t), "fence:{shared}:released").Val()["fence:{shared}:released"] != 0 {
			if time.Now().After(deadline) {
				t.Fatal("subscriptions still there 10 s after the waiter left")
			}
			time.Sleep(5 * time.Millisecond) // polling with a deadline
		}
	}
}

// killSubscribers kills every connection with a subscription (sub= or
// psub= above zero in CLIENT LIST: rueidis subscribes on RESP3, where
// CLIENT KILL TYPE pubsub does not see it) and returns how many.
func killSubscribers(t *testing.T, admin *redis.Client) int {
	t.Helper()
	list, err := admin.ClientList(ctx(t)).Result()
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		var id string
		subscribed := false
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "id":
				id = v
			case "sub", "psub", "ssub":
				subscribed = subscribed || v != "0"
			}
		}
		if subscribed {
			if err := admin.ClientKillByFilter(ctx(t), "ID", id).Err(); err != nil {
				t.Fatal(err)
			}
			killed++
		}
	}
	return killed
}

// TestReplicaCutConcurrent: 64 goroutines acquire at once with the replica
// stopped, so that rueidis pipelines their EVALSHA+WAIT pairs on shared
// connections. Every WAIT must count its own script's write: a WAIT sent
// apart from its EVALSHA (on a connection with older writes) would report
// the cut replica as caught up. Every acquisition must refuse and leave
// nothing held.
func TestReplicaCutConcurrent(t *testing.T) {
	const n = 64
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	l := newLocker(t, client(t, primary.Addr), redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 200 * time.Millisecond}})
	// Writes through the client before the cut, replicated.
	for i := range n {
		lease, err := l.Acquire(ctx(t), fmt.Sprintf("warm:%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	// Stop the replica with its link up: the primary still counts it, at
	// the offset it last acknowledged, which covers every write made so
	// far, so only a WAIT after a newer write on its own connection sees
	// it behind.
	replica.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { replica.Signal(syscall.SIGCONT) })
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = l.Acquire(ctx(t), fmt.Sprintf("cut:%d", i), fence.TTL(time.Minute))
		}()
	}
	wg.Wait()
	admin := primary.Client(t)
	for i, err := range errs {
		var nr *fence.NotReplicatedError
		if !errors.As(err, &nr) || nr.Acked != 0 {
			t.Errorf("Acquire %d with the replica stopped = %v, want ErrNotReplicated 0 of 1", i, err)
		}
		if admin.Exists(ctx(t), lockKey(fmt.Sprintf("cut:%d", i))).Val() != 0 {
			t.Errorf("refused acquisition %d left the lock held", i)
		}
	}
}

// TestScriptFlush: SCRIPT FLUSH between calls, with and without WAIT after
// the script: every call falls back to EVAL and succeeds.
func TestScriptFlush(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	c := client(t, primary.Addr)
	for _, rs := range []redislock.ReplicaSync{{Disabled: true}, {Replicas: 1}} {
		l := newLocker(t, c, redislock.Options{ReplicaSync: rs})
		flush := func() {
			if err := admin.ScriptFlush(ctx(t)).Err(); err != nil {
				t.Fatal(err)
			}
		}
		flush()
		lease, err := l.Acquire(ctx(t), "flush", fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("Acquire after SCRIPT FLUSH (%+v): %v", rs, err)
		}
		flush()
		if err := lease.Extend(ctx(t), time.Minute); err != nil {
			t.Fatalf("Extend after SCRIPT FLUSH (%+v): %v", rs, err)
		}
		flush()
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatalf("Release after SCRIPT FLUSH (%+v): %v", rs, err)
		}
		if admin.Exists(ctx(t), lockKey("flush")).Val() != 0 {
			t.Fatal("lock held after Release")
		}
	}
}

// TestClosedClient: a Locker on a client closed before New, or closed
// under a held lease, answers every call with an error within the
// caller's deadline, never a panic or a hang.
func TestClosedClient(t *testing.T) {
	srv := redistest.Start(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := fencerueidis.New(c, &redislock.Options{WatchdogTTL: watchdogTTL})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx(t), "closed", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	within := func(what string, call func(ctx context.Context) error) {
		t.Helper()
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		err := call(dctx)
		if err == nil {
			t.Errorf("%s on a closed client succeeded", what)
		}
		if took := time.Since(start); took > 2500*time.Millisecond {
			t.Errorf("%s took %v", what, took)
		}
		t.Logf("%s: %v", what, err)
	}
	within("Acquire", func(ctx context.Context) error { _, err := l.Acquire(ctx, "other"); return err })
	within("waiting Acquire", func(ctx context.Context) error {
		_, err := l.Acquire(ctx, "closed", fence.Wait(time.Second))
		return err
	})
	within("Extend", func(ctx context.Context) error { return lease.Extend(ctx, time.Minute) })
	within("Status", func(ctx context.Context) error { _, err := l.Status(ctx, "closed"); return err })
	within("Release", func(ctx context.Context) error { return lease.Release(ctx) })
	l2, err := fencerueidis.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	within("Acquire on a Locker made after Close", func(ctx context.Context) error { _, err := l2.Acquire(ctx, "x"); return err })
}

// TestClusterClient: a rueidis client given a cluster node's address
// detects the cluster and New refuses it with ErrInvalidOption; a client
// forced to one node (ForceSingleClient) is accepted as the standalone
// client it is, and a name whose slot that node does not serve fails with
// the server's MOVED, never a lock taken elsewhere or a panic.
func TestClusterClient(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := client(t, cl.Addrs()[0])
	if _, err := fencerueidis.New(c, nil); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("New on a cluster client = %v, want ErrInvalidOption", err)
	}
	single, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{cl.Addrs()[0]}, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(single.Close)
	l, err := fencerueidis.New(single, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatalf("New on a single-node client of a cluster node: %v", err)
	}
	moved := 0
	for i := range 20 {
		lease, err := l.Acquire(ctx(t), fmt.Sprintf("n%d", i), fence.TTL(time.Minute))
		if err != nil {
			if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "MOVED") {
				t.Fatalf("Acquire n%d = %v, want ErrNotAcquired with MOVED", i, err)
			}
			moved++
			continue
		}
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	if moved == 0 {
		t.Fatal("no name hashed to another node's slot")
	}
}

// TestConformanceRESP2: the suite on AlwaysRESP2 clients, whose waiters
// subscribe through a dedicated client.
func TestConformanceRESP2(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New: func(t testing.TB) fence.Locker {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, AlwaysRESP2: true, DisableCache: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			return newLocker(t, c, redislock.Options{})
		},
		Remove:      func(t testing.TB, name string) { admin.Del(context.Background(), lockKey(name)) },
		WatchdogTTL: watchdogTTL,
	})
}

// TestWaitDeniedGivesLockBack: a user whose ACL denies WAIT runs the
// acquire script (the lock is taken) and has WAIT refused. The Acquire
// fails, and the lock it took must be given back at once, as on go-redis:
// through the Conn seam a WAIT error used to look like the script's own,
// so nothing gave it back and it stayed held by nobody for the lease time.
func TestWaitDeniedGivesLockBack(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	if err := admin.Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-wait").Err(); err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, Username: "app", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	l := newLocker(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: time.Second}})
	for _, wait := range []time.Duration{0, 5 * time.Second} {
		name := fmt.Sprintf("lock:wait-denied:%v", wait)
		_, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute), fence.Wait(wait))
		if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "NOPERM") {
			t.Fatalf("Acquire (wait %v) = %v, want ErrNotAcquired with NOPERM", wait, err)
		}
		awaitGone(t, admin, name, 5*time.Second, fmt.Sprintf("wait %v: the lock taken before WAIT failed", wait))
	}
}

// awaitGone fails the test, saying what of held, unless the lock called name
// is gone within d.
func awaitGone(t *testing.T, admin *redis.Client, name string, d time.Duration, held string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for admin.Exists(ctx(t), lockKey(name)).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s is still held (PTTL %v)", held, admin.PTTL(ctx(t), lockKey(name)).Val())
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

// TestNoScriptWaitsOnce: as redislock's test of that name, on rueidis: with
// the replica paused, an acquisition refused with NOSCRIPT fails within
// about the sync timeout, not twice it (the WAIT pipelined with the refused
// EVALSHA runs anyway; the one sent again with EVAL gets what is left).
func TestNoScriptWaitsOnce(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	l := newLocker(t, client(t, primary.Addr), redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: time.Second}})
	lease, err := l.Acquire(ctx(t), "warm", fence.TTL(time.Minute)) // the scripts cached
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	replica.Pause(t)
	var took [2]time.Duration
	for i, name := range []string{"cached", "flushed"} {
		if name == "flushed" {
			if err := admin.ScriptFlush(ctx(t)).Err(); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		_, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
		took[i] = time.Since(start)
		if !errors.Is(err, fence.ErrNotReplicated) {
			t.Fatalf("Acquire %s with the replica paused = %v, want ErrNotReplicated", name, err)
		}
	}
	t.Logf("failed acquisition: %v with the scripts cached, %v after SCRIPT FLUSH", took[0], took[1])
	if took[1] > took[0]*3/2 {
		t.Errorf("after NOSCRIPT the acquisition took %.2f× one with its scripts cached: it waited for the replica twice", float64(took[1])/float64(took[0]))
	}
}
