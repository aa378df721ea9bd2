package redislock_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// refusingLocker returns a Locker on srv whose dials are refused while
// lr.refuse holds (lr starts refusing).
func refusingLocker(t *testing.T, srv *redistest.Server, o *redis.Options) (*redislock.Locker, *lostReply, *redis.Client) {
	t.Helper()
	lr := &lostReply{refuse: true}
	if o == nil {
		o = &redis.Options{DialerRetries: 1, MaxRetries: 1}
	}
	l, c := lockerDialing(t, srv, lr, o)
	return l, lr, c
}

// lockerDialing is a Locker (replica sync off) on a client of srv with
// options o whose connections lr dials.
func lockerDialing(t *testing.T, srv *redistest.Server, lr *lostReply, o *redis.Options) (*redislock.Locker, *redis.Client) {
	t.Helper()
	opts := *o
	opts.Addr, opts.Dialer = srv.Addr, lr.dial
	c := redis.NewClient(&opts)
	t.Cleanup(func() { _ = c.Close() })
	return lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}), c
}

func heapInUse() uint64 {
	var m runtime.MemStats
	for range 2 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestParkedGiveBackSize: the doc says that, while a server is down, each
// failed Acquire holds under a kilobyte for its lease time (its parked
// give-back). A flood of refused Acquires, measured.
func TestParkedGiveBackSize(t *testing.T) {
	srv := redistest.Start(t)
	l, _, _ := refusingLocker(t, srv, nil)
	// Warm up: the name's keys cached, the parking's goroutine started.
	if _, err := l.Acquire(ctx(t), "lock:flood", fence.TTL(time.Hour)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Acquire with every dial refused: %v", err)
	}
	const n, workers = 1000, 20
	c := ctx(t) // one: each ctx(t) holds its timer until the test ends
	before := heapInUse()
	errs := make(chan error, workers)
	for range workers {
		go func() {
			for range n / workers {
				if _, err := l.Acquire(c, "lock:flood", fence.TTL(time.Hour)); !errors.Is(err, syscall.ECONNREFUSED) {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatalf("Acquire with every dial refused: %v", err)
		}
	}
	after := heapInUse()
	if got := redislock.Parked(l); got != n+1 {
		t.Fatalf("%d parked, want %d", got, n+1)
	}
	per := (int64(after) - int64(before)) / n
	t.Logf("%d bytes per parked give-back", per)
	if per >= 1024 {
		t.Fatalf("each refused Acquire holds %d bytes while the server is down; the doc says under a kilobyte", per)
	}
}

// TestNoResendsParkNothing: on a client that never resends (MaxRetries -1)
// a refused Acquire was never sent: nothing is parked, no goroutine runs.
func TestNoResendsParkNothing(t *testing.T) {
	srv := redistest.Start(t)
	l, _, _ := refusingLocker(t, srv, &redis.Options{MaxRetries: -1, DialerRetries: 1})
	waitFor(t, func() bool { return goroutinesBy(parkingFn) == 0 }) // other tests' Lockers
	for range 5 {
		if _, err := l.Acquire(ctx(t), "lock:no-resends", fence.TTL(time.Minute)); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Acquire with every dial refused: %v", err)
		}
	}
	if got := redislock.Parked(l); got != 0 {
		t.Fatalf("%d give-backs parked on a client that never resends", got)
	}
	if got := goroutinesBy(parkingFn); got != 0 {
		t.Fatalf("%d parking goroutines on a client that never resends", got)
	}
}

// TestWaitingThroughRefusals: a waiting Acquire whose tries are refused
// (each may hide a resend of a copy that ran) gets the lock once the
// server answers; its lease, marked resent, releases the lock with a
// revocation mark, and nothing is left parked.
func TestWaitingThroughRefusals(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:wait-refused"
	var dials atomic.Int64
	lr := &lostReply{refuse: true}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, DialerRetries: 1, MaxRetries: 1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return lr.dial(ctx, network, addr)
		}})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	type result struct {
		ls  fence.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		got <- result{ls, err}
	}()
	waitFor(t, func() bool { return dials.Load() >= 4 }) // a few tries refused
	lr.set(func() { lr.refuse = false })
	r := <-got
	if r.err != nil {
		t.Fatalf("waiting Acquire after refusals: %v", r.err)
	}
	if owner := admin.Get(ctx(t), lockKey(name)).Val(); owner == "" {
		t.Fatal("the lease's lock is not on the server")
	}
	select {
	case <-r.ls.Done():
		t.Fatalf("lease ended at once: %v", r.ls.Err())
	default:
	}
	if err := r.ls.Extend(ctx(t), time.Minute); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if err := r.ls.Release(ctx(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if n := admin.Exists(ctx(t), lockKey(name)).Val(); n != 0 {
		t.Fatal("the lock is still there after Release")
	}
	if marks := len(admin.Keys(ctx(t), lockKey(name)+":revoked:*").Val()); marks != 1 {
		t.Fatalf("%d revocation marks after the release of a lease whose earlier tries may have run, want 1", marks)
	}
	if got := redislock.Parked(l); got != 0 {
		t.Fatalf("%d give-backs parked by an Acquire that got its lease", got)
	}
	// A new Acquire gets the lock: nothing left behind blocks it.
	ls, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	_ = ls.Release(ctx(t))
}

// TestParkedGiveBackSparesNewOwner: a ghost acquisition (its reply lost,
// its resend refused) parks its give-back; meanwhile the lock is freed
// and another owner takes it. The give-back, sent once the server answers,
// must leave that owner's lock alone (owner-checked), though it still
// writes its own revocation mark.
func TestParkedGiveBackSparesNewOwner(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:parked-spares"
	lock := lockKey(name)
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	lr := &lostReply{match: []byte(lock)}
	l, _ := lockerDialing(t, srv, lr, &redis.Options{DialerRetries: 1})
	if err := acquire(t, l, "lock:warm-up").Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lr.set(func() { lr.armed = true })
	if _, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Acquire whose resend was refused: %v", err)
	}
	ghost := admin.Get(ctx(t), lock).Val()
	if ghost == "" {
		t.Fatal("the lost acquisition did not take the lock")
	}
	waitFor(t, func() bool { return redislock.Parked(l) == 1 })
	// The ghost's lock goes (expired, say) and another owner takes it.
	admin.Del(ctx(t), lock)
	other := acquire(t, lockerWith(t, srv.Client(t), opts), name, fence.TTL(time.Minute))
	lr.set(func() { lr.refuse = false })
	waitFor(t, func() bool { return redislock.Parked(l) == 0 && parkingIdle() })
	waitFor(t, func() bool { return len(admin.Keys(ctx(t), lock+":revoked:*").Val()) == 1 })
	if now := admin.Get(ctx(t), lock).Val(); now == "" || now == ghost {
		t.Fatalf("the parked give-back took the new owner's lock: %q", now)
	}
	if err := other.Release(ctx(t)); err != nil {
		t.Fatalf("the new owner's Release after the give-back: %v", err)
	}
}

// TestParkedGiveBacksPausedServer: the server answers dials again but
// hangs (SIGSTOP): the probe gives up after probeFor, which is no answer,
// and the parked give-backs (more than are sent at a time) stay parked;
// once it resumes they all run, and the goroutines end.
func TestParkedGiveBacksPausedServer(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	l, lr, _ := refusingLocker(t, srv, nil)
	const n = 70
	c := ctx(t)
	for range n {
		if _, err := l.Acquire(c, "lock:parked-paused", fence.TTL(time.Minute)); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Acquire with every dial refused: %v", err)
		}
	}
	resume := srv.Pause(t)
	lr.set(func() { lr.refuse = false })
	// A probe hangs: nothing is handed out meanwhile.
	waitFor(t, probing)
	if got := redislock.Parked(l); got != n {
		t.Fatalf("%d parked while the probe hangs, want %d", got, n)
	}
	resume()
	waitFor(t, func() bool { return redislock.Parked(l) == 0 })
	waitFor(t, parkingIdle)
	if marks := len(admin.Keys(ctx(t), lockKey("lock:parked-paused")+":revoked:*").Val()); marks != n {
		t.Fatalf("%d revocation marks after the server resumed, want %d", marks, n)
	}
}

// TestParkedGiveBacksClientClosedWhileProbing: the client is closed while
// a probe hangs on a paused server: every goroutine ends, nothing panics,
// nothing is left parked.
func TestParkedGiveBacksClientClosedWhileProbing(t *testing.T) {
	srv := redistest.Start(t)
	l, lr, cl := refusingLocker(t, srv, nil)
	const n = 70
	c := ctx(t)
	for range n {
		if _, err := l.Acquire(c, "lock:parked-closed", fence.TTL(time.Hour)); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Acquire with every dial refused: %v", err)
		}
	}
	resume := srv.Pause(t)
	lr.set(func() { lr.refuse = false })
	waitFor(t, probing)
	_ = cl.Close()
	waitFor(t, parkingIdle)
	resume()
	if got := redislock.Parked(l); got != 0 {
		t.Fatalf("%d left parked after the client closed", got)
	}
}

// TestResetGiveBacksPileUp: a proxy in front of a server that is down (or
// a server shedding connections) accepts each connection and closes it:
// every Acquire fails with io.EOF, which may follow a script that ran, so
// each leaves a give-back. Those were retried in a goroutine each for
// their lease time (only refusals were parked): a flood of such Acquires
// held a goroutine each. Now any give-back that fails on its way is
// parked, with one goroutine for all.
func TestResetGiveBacksPileUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: 1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const n = 50
	cx := ctx(t)
	for range n {
		if _, err := l.Acquire(cx, "lock:reset", fence.TTL(time.Minute)); err == nil {
			t.Fatal("acquired through a proxy that closes every connection")
		}
	}
	// Each give-back's first try, in a goroutine of its own, fails and
	// parks it.
	waitFor(t, func() bool { return goroutinesBy(giveBackFn) == 0 })
	if got := redislock.Parked(l); got != n {
		t.Fatalf("%d give-backs parked after %d Acquires failed by resets, want %d", got, n, n)
	}
	if got := goroutinesBy(parkingFn); got != 1 {
		t.Fatalf("%d parking goroutines, want 1", got)
	}
}
