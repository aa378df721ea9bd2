package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// Attacks on a Locker over a *redis.Ring whose shards go down, come back
// or are replaced (Ring.SetAddrs) while leases are held and Acquires wait.

// ringOf returns a Ring of two fresh primaries, shard0 and shard1, that
// checks its shards every 20 ms, and the primaries.
func ringOf(t *testing.T, tweak func(*redis.RingOptions)) (*redis.Ring, [2]*redistest.Server) {
	t.Helper()
	srv := [2]*redistest.Server{redistest.Start(t), redistest.Start(t)}
	o := &redis.RingOptions{
		Addrs:              map[string]string{"shard0": srv[0].Addr, "shard1": srv[1].Addr},
		HeartbeatFrequency: 20 * time.Millisecond,
	}
	if tweak != nil {
		tweak(o)
	}
	ring := redis.NewRing(o)
	t.Cleanup(func() { _ = ring.Close() })
	return ring, srv
}

// waitRing polls, with a deadline, until the Ring has (up) or has not any
// live shard for key.
func waitRing(t *testing.T, ring *redis.Ring, key string, up bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := ring.GetShardClientForKey(key)
		if (err == nil) == up {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Ring's shards never went up=%v: %v", up, err)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// TestRingAllShardsDown: every shard of the Ring killed and marked down
// by its heartbeat. Acquire, Extend, Release and Status must fail within
// the caller's deadline (Acquire with an error matching
// fence.ErrNotAcquired), without a panic; and an Acquire with a wait
// budget must keep trying, as it does when a plain client's server is
// unreachable, and take the lock once the shards are back. Before the
// fix the Ring's "all ring shards are down" was not transient: the
// waiting Acquire failed at once.
func TestRingAllShardsDown(t *testing.T) {
	t.Parallel() // own shards; mostly waits out the outage and the 2 s deadlines
	for _, sync := range []bool{true, false} {
		t.Run(map[bool]string{true: "sync", false: "nosync"}[sync], func(t *testing.T) {
			ring, srv := ringOf(t, nil)
			l := lockerWith(t, ring, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: !sync}})
			lease, err := l.Acquire(ctx(t), "down-held", fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			srv[0].Kill()
			srv[1].Kill()
			waitRing(t, ring, lockKey("down"), false)

			bounded := func(what string, f func(context.Context) error) error {
				t.Helper()
				c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				start := time.Now()
				err := f(c)
				if took := time.Since(start); took > 2500*time.Millisecond {
					t.Errorf("%s took %v with a 2 s deadline", what, took)
				}
				if err == nil {
					t.Errorf("%s with every shard down = nil; want an error", what)
				}
				return err
			}
			err = bounded("Acquire", func(c context.Context) error {
				_, err := l.Acquire(c, "down", fence.TTL(time.Minute))
				return err
			})
			if !errors.Is(err, fence.ErrNotAcquired) {
				t.Errorf("Acquire with every shard down = %v; want fence.ErrNotAcquired", err)
			}
			bounded("Extend", func(c context.Context) error { return lease.Extend(c, time.Minute) })
			if err := lease.Err(); err != nil {
				t.Errorf("a failed Extend ended the lease: %v", err)
			}
			bounded("Status", func(c context.Context) error { _, err := l.Status(c, "down-held"); return err })
			if sync {
				bounded("ReplicaCounts", func(c context.Context) error { _, err := l.ReplicaCounts(c, "down-held"); return err })
			}

			// A waiting Acquire outlives the outage.
			got := make(chan error, 1)
			go func() {
				lease, err := l.Acquire(ctx(t), "down", fence.TTL(time.Minute), fence.Wait(20*time.Second))
				if err == nil {
					err = lease.Release(ctx(t))
				}
				got <- err
			}()
			outlasts(t, got, srv)
			// The servers came back empty: the lease is lost, and Release
			// says so rather than panicking.
			if err := lease.Release(ctx(t)); !errors.Is(err, fence.ErrLeaseLost) {
				t.Errorf("Release after the shards restarted empty = %v; want fence.ErrLeaseLost", err)
			}
		})
	}
}

// swapAddrs returns addrs with each address written another way
// ("localhost:port" for "127.0.0.1:port"), so that Ring.SetAddrs replaces
// (and closes) every shard client while the servers stay the same.
// outlasts checks that the waiting Acquire whose result got will carry
// has not returned 300 ms into an outage of every shard, relaunches the
// shards, and checks that it then got a lease.
func outlasts(t *testing.T, got <-chan error, srv [2]*redistest.Server) {
	t.Helper()
	select {
	case err := <-got:
		t.Fatalf("a waiting Acquire with every shard down returned at once: %v", err)
	case <-time.After(300 * time.Millisecond): // the outage lasts a while
	}
	for _, s := range srv {
		if err := s.Relaunch(); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Errorf("waiting Acquire across the outage = %v; want a lease", err)
	}
}

func swapAddrs(t *testing.T, addrs map[string]string) map[string]string {
	t.Helper()
	out := make(map[string]string, len(addrs))
	for name, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatal(err)
		}
		if host == "localhost" {
			host = "127.0.0.1"
		} else {
			host = "localhost"
		}
		out[name] = net.JoinHostPort(host, port)
	}
	return out
}

// TestRingShardReplacedUnderCall: Ring.SetAddrs replaces the lock shard's
// client (same server, another address string) between the moment
// redislock picked it and the moment the call is sent on it, so that the
// call finds it closed (redis.ErrClosed): a shard hook calls SetAddrs
// before passing the armed command on. Nothing was sent; the Ring has a
// live client for the same shard. An Acquire, an Extend and a Release
// must go through (on the new client) rather than fail as if the
// caller's own client were closed. Before the fix all three failed with
// "redis: client is closed", an Acquire with a wait budget too.
func TestRingShardReplacedUnderCall(t *testing.T) {
	for _, sync := range []bool{true, false} {
		t.Run(map[bool]string{true: "sync", false: "nosync"}[sync], func(t *testing.T) {
			var ring *redis.Ring
			var armed atomic.Bool
			var addrs atomic.Pointer[map[string]string]
			replace := func() {
				if armed.CompareAndSwap(true, false) {
					next := swapAddrs(t, *addrs.Load())
					addrs.Store(&next)
					ring.SetAddrs(next)
				}
			}
			ring, srv := ringOf(t, func(o *redis.RingOptions) {
				a := o.Addrs
				addrs.Store(&a)
				o.NewClient = func(opt *redis.Options) *redis.Client {
					c := redis.NewClient(opt)
					c.AddHook(replaceHook{replace})
					return c
				}
			})
			_ = srv
			l := lockerWith(t, ring, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: !sync}})

			armed.Store(true)
			lease, err := l.Acquire(ctx(t), "replaced", fence.TTL(time.Minute))
			if err != nil {
				t.Fatalf("Acquire with the shard client replaced under it = %v; want a lease", err)
			}
			armed.Store(true)
			if err := lease.Extend(ctx(t), time.Minute); err != nil {
				t.Errorf("Extend with the shard client replaced under it = %v", err)
			}
			armed.Store(true)
			if err := lease.Release(ctx(t)); err != nil {
				t.Errorf("Release with the shard client replaced under it = %v", err)
			}
			if n := ring.Exists(ctx(t), lockKey("replaced")).Val(); n != 0 {
				t.Errorf("the lock is still held after Release")
			}
			armed.Store(true)
			lease, err = l.Acquire(ctx(t), "replaced", fence.TTL(time.Minute), fence.Wait(5*time.Second))
			if err != nil {
				t.Fatalf("waiting Acquire with the shard client replaced under it = %v; want a lease", err)
			}
			_ = lease.Release(ctx(t))
		})
	}
}

// replaceHook calls replace before every script command it passes on.
type replaceHook struct{ replace func() }

func (h replaceHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h replaceHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			h.replace()
		}
		return next(ctx, cmd)
	}
}

func (h replaceHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if isScript(cmd) {
				h.replace()
				break
			}
		}
		return next(ctx, cmds)
	}
}

func isScript(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "evalsha", "eval":
		return true
	}
	return false
}

// TestRingShardReplacedWhileWaiting: a waiter subscribed on the Ring,
// then Ring.SetAddrs replaces every shard client (same servers, other
// address strings; the old clients, and their subscriptions, are closed),
// then the holder releases. The waiter must get the lock within seconds,
// not wait out the holder's minute-long TTL.
func TestRingShardReplacedWhileWaiting(t *testing.T) {
	ring, srv := ringOf(t, nil)
	l := lockerWith(t, ring, redislock.Options{})
	holder, err := l.Acquire(ctx(t), "replaced-wait", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx(t), "replaced-wait", fence.TTL(time.Minute), fence.Wait(20*time.Second))
		if err == nil {
			err = lease.Release(ctx(t))
		}
		got <- err
	}()
	channel := lockKey("replaced-wait") + ":released"
	deadline := time.Now().Add(10 * time.Second)
	subscribed := func() int64 {
		var n int64
		for _, s := range srv {
			n += s.Client(t).PubSubNumSub(ctx(t), channel).Val()[channel]
		}
		return n
	}
	for subscribed() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never subscribed")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	ring.SetAddrs(swapAddrs(t, ring.Options().Addrs))
	start := time.Now()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("waiter = %v; want a lease", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the waiter took the lock %v after the release", took)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter did not get the lock within 15 s of the release")
	}
}

// TestRingGoneBeforeSubscribe: a waiting Acquire's first try finds the
// lock held, and before the waiter subscribes, the Ring is closed (a
// shutdown) or every shard is killed and marked down (a shard hook does
// either once the try's reply is in). Ring.Subscribe panics when the Ring
// has no shard for the channel; the waiter must instead fail with an
// error matching fence.ErrNotAcquired (closed), or keep waiting and take
// the lock once the shards are back (down). Before the fix the test
// binary died of the panic in redislock's subscription goroutine.
func TestRingGoneBeforeSubscribe(t *testing.T) {
	t.Parallel() // own shards; mostly waits out the outage
	for _, mode := range []string{"closed", "down"} {
		t.Run(mode, func(t *testing.T) {
			var ring *redis.Ring
			var srv [2]*redistest.Server
			var armed atomic.Bool
			downed := make(chan struct{}) // closed once the Ring marks every shard down
			after := func() {
				if !armed.CompareAndSwap(true, false) {
					return
				}
				if mode == "closed" {
					_ = ring.Close()
					return
				}
				srv[0].Kill()
				srv[1].Kill()
				waitRing(t, ring, lockKey("gone"), false)
				close(downed)
			}
			ring, srv = ringOf(t, func(o *redis.RingOptions) {
				o.NewClient = func(opt *redis.Options) *redis.Client {
					c := redis.NewClient(opt)
					c.AddHook(afterHook{after})
					return c
				}
			})
			l := lockerWith(t, ring, redislock.Options{})
			holder, err := l.Acquire(ctx(t), "gone", fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			armed.Store(true)
			got := make(chan error, 1)
			go func() {
				lease, err := l.Acquire(ctx(t), "gone", fence.TTL(time.Minute), fence.Wait(20*time.Second))
				if err == nil {
					err = lease.Release(ctx(t))
				}
				got <- err
			}()
			if mode == "closed" {
				if err := <-got; !errors.Is(err, fence.ErrNotAcquired) {
					t.Errorf("waiting Acquire on a Ring closed under it = %v; want fence.ErrNotAcquired", err)
				}
				_ = holder.Release(ctx(t))
				return
			}
			<-downed
			outlasts(t, got, srv)
			_ = holder.Release(ctx(t)) // lost: the shards came back empty
		})
	}
}

// afterHook calls after once a script command has its reply.
type afterHook struct{ after func() }

func (h afterHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h afterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if isScript(cmd) {
			h.after()
		}
		return err
	}
}

func (h afterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if isScript(cmd) {
				h.after()
				break
			}
		}
		return err
	}
}

// countHook counts the script commands it sees, alone or in pipelines.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if isScript(cmd) {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// TestRingHooks checks the package doc's claim on hooks with replica sync
// on a Ring: hooks on the shard clients see every script call (Acquire,
// Extend, Release); hooks added to the Ring itself do not see the synced
// ones (Acquire, Extend); and Ring.OnNewNode, called after NewRing, does
// not reach the shards the Ring already has (the doc pointed to it for
// shard hooks).
func TestRingHooks(t *testing.T) {
	var shard, ringHook, onNew atomic.Int64
	ring, _ := ringOf(t, func(o *redis.RingOptions) {
		o.NewClient = func(opt *redis.Options) *redis.Client {
			c := redis.NewClient(opt)
			c.AddHook(countHook{&shard})
			return c
		}
	})
	ring.AddHook(countHook{&ringHook})
	ring.OnNewNode(func(c *redis.Client) { c.AddHook(countHook{&onNew}) })
	l := lockerWith(t, ring, redislock.Options{})
	for round := range 2 {
		// Round 0 loads the scripts (EVALSHA, then EVAL) and reads the
		// replica counts; round 1 counts one command per call.
		shard.Store(0)
		ringHook.Store(0)
		lease, err := l.Acquire(ctx(t), "hooks", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		afterAcquire := shard.Load()
		if err := lease.Extend(ctx(t), time.Minute); err != nil {
			t.Fatal(err)
		}
		afterExtend := shard.Load()
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if round == 0 {
			continue
		}
		if afterAcquire != 1 || afterExtend != 2 || shard.Load() != 3 {
			t.Errorf("shard hooks saw %d scripts after Acquire, %d after Extend, %d after Release; want 1, 2, 3", afterAcquire, afterExtend, shard.Load())
		}
		if n := ringHook.Load(); n != 1 {
			t.Errorf("the Ring's own hook saw %d script calls; want 1 (the unsynced release)", n)
		}
	}
	if n := onNew.Load(); n != 0 {
		t.Errorf("a hook added through OnNewNode after NewRing saw %d script calls; want 0", n)
	}
}

// TestRingReshardEndsLease: Ring.SetAddrs moves a held lock's name to
// another primary (the doc's reshard). The old lease's Extend must end it
// as lost; a new Acquire on the new primary gets a larger token (the clock
// floor); the old lease's Release must not delete the new holder's lock.
func TestRingReshardEndsLease(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"shard0": a.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	l := lockerWith(t, ring, redislock.Options{})
	old, err := l.Acquire(ctx(t), "reshard", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ring.SetAddrs(map[string]string{"shard0": b.Addr})
	if err := old.Extend(ctx(t), time.Minute); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Extend after the reshard = %v; want fence.ErrLeaseLost", err)
	}
	if !errors.Is(old.Err(), fence.ErrLeaseLost) {
		t.Errorf("the old lease's Err after the lost renewal = %v", old.Err())
	}
	next, err := l.Acquire(ctx(t), "reshard", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= old.Token() {
		t.Errorf("token on the new shard %d <= the old holder's %d", next.Token(), old.Token())
	}
	if err := old.Release(ctx(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("the old lease's Release = %v; want fence.ErrLeaseLost", err)
	}
	if b.Client(t).Exists(ctx(t), lockKey("reshard")).Val() != 1 {
		t.Fatal("the old lease's Release deleted the new holder's lock")
	}
	if err := next.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

// TestRingShardHung: the lock's shard is paused (SIGSTOP; the Ring's
// heartbeat has not marked it down yet). Acquire, Extend, Release and
// Status on a name there must return by a 500 ms deadline, with sync on
// and off; a name on the other shard is served meanwhile.
func TestRingShardHung(t *testing.T) {
	t.Parallel() // own shards; mostly waits out the 500 ms deadlines
	for _, sync := range []bool{true, false} {
		t.Run(map[bool]string{true: "sync", false: "nosync"}[sync], func(t *testing.T) {
			ring, srv := ringOf(t, func(o *redis.RingOptions) { o.HeartbeatFrequency = time.Minute })
			l := lockerWith(t, ring, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: !sync}})
			shards := []*ringShard{{name: "shard0", primary: srv[0]}, {name: "shard1", primary: srv[1]}}
			hung, live := nameOn(t, ring, shards[0], "hung"), nameOn(t, ring, shards[1], "live")
			lease, err := l.Acquire(ctx(t), hung, fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			srv[0].Signal(syscall.SIGSTOP)
			defer srv[0].Signal(syscall.SIGCONT)
			within := func(what string, f func(context.Context) error) {
				t.Helper()
				c, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				defer cancel()
				start := time.Now()
				err := f(c)
				if took := time.Since(start); took > time.Second {
					t.Errorf("%s on the hung shard took %v with a 500 ms deadline", what, took)
				}
				if err == nil {
					t.Errorf("%s on the hung shard = nil; want an error", what)
				}
			}
			within("Acquire", func(c context.Context) error {
				_, err := l.Acquire(c, hung+"-2", fence.TTL(time.Minute), fence.Wait(time.Second))
				return err
			})
			within("Extend", func(c context.Context) error { return lease.Extend(c, time.Minute) })
			within("Status", func(c context.Context) error { _, err := l.Status(c, hung); return err })
			within("Release", lease.Release)
			other, err := l.Acquire(ctx(t), live, fence.TTL(time.Minute))
			if err != nil {
				t.Fatalf("Acquire on the live shard while the other is hung = %v", err)
			}
			_ = other.Release(ctx(t))
		})
	}
}

// TestRingSameAddrTwice: one primary (with a replica) listed under two
// shard names, next to a primary without replicas under a third. The
// replica-count cache is keyed by address: the two names share the
// primary's counts, which are right for both, and the third keeps its own.
// With the replica paused, locks on both names of the replicated primary
// are refused and one on the bare primary is taken.
func TestRingSameAddrTwice(t *testing.T) {
	p, bare := redistest.Start(t), redistest.Start(t)
	replica := redistest.StartReplica(t, p)
	redistest.WaitReplicated(t, p, 1)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": p.Addr, "b": p.Addr, "c": bare.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	l := lockerWith(t, ring, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
	var names []string // one name per shard name: a, b, c
	seen := map[*redis.Client]bool{}
	for i := 0; len(names) < 3 && i < 10000; i++ {
		name := fmt.Sprintf("twice-%d", i)
		c, err := ring.GetShardClientForKey(lockKey(name))
		if err != nil {
			t.Fatal(err)
		}
		if !seen[c] {
			seen[c] = true
			names = append(names, name)
		}
	}
	if len(names) != 3 {
		t.Fatalf("found names on %d shard clients; want 3", len(names))
	}
	for _, name := range names {
		if err := tryOnce(t, l, name); err != nil {
			t.Fatalf("Acquire(%q) with the replica running = %v", name, err)
		}
	}
	replica.Signal(syscall.SIGSTOP)
	defer replica.Signal(syscall.SIGCONT)
	for _, name := range names {
		c, _ := ring.GetShardClientForKey(lockKey(name))
		err := tryOnce(t, l, name)
		if c.Options().Addr == bare.Addr {
			if err != nil {
				t.Errorf("Acquire(%q) on the bare primary = %v", name, err)
			}
		} else if !errors.Is(err, fence.ErrNotReplicated) {
			t.Errorf("Acquire(%q) on the replicated primary with its replica paused = %v; want fence.ErrNotReplicated", name, err)
		}
	}
}
