package fencerueidis_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencerueidis"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// watchdogTTL is the lease time of the tests' watchdog leases, renewed every
// third of it. 300 ms (redislock's tests use it) once let CI's load, with
// other packages' tests beside these, starve a watchdog past its deadline
// (conformance's WatchdogKeepsLease saw another Acquire get the lock).
const watchdogTTL = time.Second

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// client returns a rueidis client of addr with its defaults (automatic
// pipelining on), closed at the end of the test.
func client(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newLocker(t testing.TB, c rueidis.Client, o redislock.Options) *redislock.Locker {
	t.Helper()
	if o.WatchdogTTL == 0 {
		o.WatchdogTTL = watchdogTTL
	}
	l, err := fencerueidis.New(c, &o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func lockKey(name string) string { return "fence:{" + name + "}" }

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New:               func(t testing.TB) fence.Locker { return newLocker(t, client(t, srv.Addr), redislock.Options{}) },
		Remove:            func(t testing.TB, name string) { admin.Del(context.Background(), lockKey(name)) },
		NewObserved: func(t testing.TB, obs fence.Observer) fence.Locker {
			return newLocker(t, client(t, srv.Addr), redislock.Options{Observer: obs})
		},
		NewLogged: func(t testing.TB, log *slog.Logger) fence.Locker {
			return newLocker(t, client(t, srv.Addr), redislock.Options{Logger: log})
		},
		NewClosable: func(t testing.TB) (fence.Locker, func()) {
			c := client(t, srv.Addr)
			return newLocker(t, c, redislock.Options{}), c.Close
		},
		WatchdogTTL: watchdogTTL,
	})
}

// TestConformanceSynced: the suite with replica sync on and a replica, so
// that every acquisition and renewal is a script with WAIT after it.
func TestConformanceSynced(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New: func(t testing.TB) fence.Locker {
			return newLocker(t, client(t, primary.Addr), redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}})
		},
		Remove:      func(t testing.TB, name string) { admin.Del(context.Background(), lockKey(name)) },
		WatchdogTTL: watchdogTTL,
	})
}

func TestNew(t *testing.T) {
	if _, err := fencerueidis.New(nil, nil); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("New(nil) = %v, want ErrInvalidOption", err)
	}
	srv := redistest.Start(t)
	c := client(t, srv.Addr)
	if _, err := fencerueidis.New(c, &redislock.Options{Prefix: "a{b"}); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("New with a bad prefix = %v, want ErrInvalidOption", err)
	}
	if _, err := fencerueidis.New(c, nil); err != nil {
		t.Errorf("New(c, nil) = %v", err)
	}
}

// TestReplicaSync: the replica record is discovered through the adapter
// (the replicas script), a cut-off replica makes an acquisition refuse
// with ErrNotReplicated and leave nothing held, and a connected one
// confirms it.
func TestReplicaSync(t *testing.T) {
	const name = "lock:payment:1001"
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	l := newLocker(t, client(t, primary.Addr), redislock.Options{})

	lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire with the replica connected: %v", err)
	}
	if err := lease.Extend(ctx(t), time.Minute); err != nil {
		t.Fatalf("Extend with the replica connected: %v", err)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	st, err := l.Status(ctx(t), name)
	if err != nil || st.Held || st.LastToken != lease.Token() || st.Replicas.Expected != 1 || st.Replicas.Connected != 1 {
		t.Fatalf("Status = %+v, %v; want free, last token %d, 1 of 1 replicas", st, err, lease.Token())
	}

	redistest.CutLink(t, primary, replica)
	start := time.Now()
	_, err = l.Acquire(ctx(t), name, fence.TTL(30*time.Second))
	var nr *fence.NotReplicatedError
	if !errors.As(err, &nr) || !errors.Is(err, fence.ErrNotAcquired) || nr.Acked != 0 || nr.Required != 1 {
		t.Fatalf("Acquire with the replica cut off = %v, want ErrNotReplicated 0 of 1", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("refusal took %v, want about the 1 s sync timeout", took)
	}
	if n := primary.Client(t).Exists(ctx(t), lockKey(name)).Val(); n != 0 {
		t.Fatal("the refused acquisition left the lock on the primary")
	}
}

// TestHungServer: a paused redis-server must not hold any call past the
// caller's deadline, and acquisitions given up on must not leave the lock
// held once it resumes.
func TestHungServer(t *testing.T) {
	const deadline, slack = 750 * time.Millisecond, 300 * time.Millisecond
	srv := redistest.Start(t)
	l := newLocker(t, client(t, srv.Addr), redislock.Options{})
	held, err := l.Acquire(ctx(t), "held", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srv.Signal(syscall.SIGSTOP)
	var once sync.Once
	resume := func() { once.Do(func() { srv.Signal(syscall.SIGCONT) }) }
	t.Cleanup(resume)
	within := func(what string, call func(ctx context.Context) error) {
		t.Helper()
		dctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		err := call(dctx)
		took := time.Since(start)
		t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
		if took > deadline+slack {
			t.Errorf("%s took %v with a %v deadline", what, took, deadline)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s = %v, want an error matching context.DeadlineExceeded", what, err)
		}
	}
	for _, wait := range []time.Duration{0, 10 * time.Second} {
		within("Acquire", func(ctx context.Context) error {
			_, err := l.Acquire(ctx, "lock:payment:1001", fence.Wait(wait), fence.TTL(time.Minute))
			if err != nil && !errors.Is(err, fence.ErrNotAcquired) {
				t.Errorf("Acquire = %v, want ErrNotAcquired", err)
			}
			return err
		})
	}
	within("Extend", func(ctx context.Context) error { return held.Extend(ctx, time.Minute) })
	within("Release", func(ctx context.Context) error { return held.Release(ctx) })
	within("Status", func(ctx context.Context) error { _, err := l.Status(ctx, "held"); return err })

	resume()
	admin := srv.Client(t)
	deadlineAt := time.Now().Add(10 * time.Second)
	for admin.Exists(ctx(t), lockKey("lock:payment:1001")).Val() != 0 {
		if time.Now().After(deadlineAt) {
			for _, k := range admin.Keys(ctx(t), "*").Val() {
				t.Logf("key %s %s pttl %v", k, admin.Get(ctx(t), k).Val(), admin.PTTL(ctx(t), k).Val())
			}
			t.Fatal("an acquisition given up on left the lock held after the server resumed")
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	if err := held.Release(ctx(t)); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release after the server resumed: %v", err)
	}
	if admin.Exists(ctx(t), lockKey("held")).Val() != 0 {
		t.Fatal("the lock is still held after Release")
	}
}

// TestInterop: a Locker on rueidis and one on go-redis share lock names:
// each excludes the other, a waiter on one is woken by a release on the
// other, and tokens keep increasing across them.
func TestInterop(t *testing.T) {
	srv := redistest.Start(t)
	r := newLocker(t, client(t, srv.Addr), redislock.Options{})
	g, err := redislock.New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := g.Acquire(ctx(t), "shared", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Acquire(ctx(t), "shared"); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("rueidis Acquire of a name go-redis holds = %v, want ErrHeld", err)
	}
	got := make(chan error, 1)
	var b fence.Lease
	go func() {
		var err error
		b, err = r.Acquire(ctx(t), "shared", fence.Wait(20*time.Second), fence.TTL(time.Minute))
		got <- err
	}()
	// The waiter is woken by the release's grant, not by the TTL (a
	// minute) nor by its budget (20 s). It is released once the waiter
	// has queued: the key polled was the waiting mark of older versions,
	// which nothing sets since the queue, so the test waited its whole
	// 10 s and never knew whether the waiter had queued.
	deadline := time.Now().Add(10 * time.Second)
	for srv.Client(t).LLen(ctx(t), "fence:{shared}:queue").Val() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the rueidis waiter did not queue within 10 s")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	start := time.Now()
	if err := a.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiting rueidis Acquire after the go-redis release: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the waiter took %v after the release", took)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("token %d after %d", b.Token(), a.Token())
	}
	if err := b.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}
