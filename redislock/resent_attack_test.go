package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// resentSetup starts a server with name held for a minute by another
// Locker, and a Locker whose client holds its next try on name in transit
// (see transit): go-redis times out its read after 300 ms and sends it
// again, and the first copy reaches Redis when the test delivers it.
func resentSetup(t *testing.T, name string) (srv *redistest.Server, admin *redis.Client, holder fence.Lease, tr *transit, l *redislock.Locker) {
	srv = redistest.Start(t)
	admin = srv.Client(t)
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	holder = acquire(t, lockerWith(t, srv.Client(t), opts), name, fence.TTL(time.Minute))
	tr = &transit{match: []byte(lockKey(name))}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: tr.dial, ReadTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return srv, admin, holder, tr, lockerWith(t, c, opts)
}

// deliverLate sends the held try and waits until Redis has run it.
func deliverLate(t *testing.T, admin *redis.Client, tr *transit) {
	t.Helper()
	before := commandCalls(t, admin, "evalsha")
	if err := tr.deliver(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return commandCalls(t, admin, "evalsha") > before })
}

// freeWithin checks that another Acquire gets name within 2 s.
func freeWithin(t *testing.T, srv *redistest.Server, admin *redis.Client, name, after string) {
	t.Helper()
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	start := time.Now()
	ls, err := lockerWith(t, srv.Client(t), opts).Acquire(ctx(t), name, fence.Wait(2*time.Second), fence.TTL(time.Second))
	if err != nil {
		t.Fatalf("%s: %v after %v; the lock is held for %v by %s", after, err, time.Since(start).Round(time.Millisecond), admin.PTTL(ctx(t), lockKey(name)).Val(), admin.Get(ctx(t), lockKey(name)).Val())
	}
	_ = ls.Release(ctx(t))
}

// TestResentPlainTryFindsHeld: a plain Acquire (no wait) whose try is
// delayed past the read timeout; go-redis sends it again, the resend finds
// the lock held and Acquire returns ErrHeld. The holder releases, then
// the first copy arrives: it must not take the lock for the owner of an
// Acquire that returned (for its lease time, a minute).
func TestResentPlainTryFindsHeld(t *testing.T) {
	resentTryGivenUp(t, "lock:resent-plain", nil, "after a plain Acquire returned ErrHeld and its first, delayed try ran")
}

// TestResentWaitingTryGivesUp: as above for a waiting Acquire whose budget
// ends while the lock is held: its first try was resent (the resend
// queued it), it withdraws, and the first copy arrives once the lock is
// free.
func TestResentWaitingTryGivesUp(t *testing.T) {
	resentTryGivenUp(t, "lock:resent-giveup", []fence.Option{fence.Wait(time.Second)}, "after a waiting Acquire gave up and its first, delayed try ran")
}

// resentTryGivenUp: an Acquire with opts, whose try is held in transit and
// resent, returns ErrHeld; the holder releases, the first copy arrives,
// and the lock must be free within freeWithin's bound.
func resentTryGivenUp(t *testing.T, name string, opts []fence.Option, what string) {
	srv, admin, holder, tr, l := resentSetup(t, name)
	tr.arm()
	if _, err := l.Acquire(ctx(t), name, append(opts, fence.TTL(time.Minute))...); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire: %v, want ErrHeld", err)
	}
	if !tr.holding() {
		t.Fatal("the try was not held in transit")
	}
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	deliverLate(t, admin, tr)
	freeWithin(t, srv, admin, name, what)
}

// TestResentTryDuringLeaseOutlivesDeadline: a plain Acquire whose try was
// resent takes the lock by the resend (a 2 s lease, never released: with
// 1 s, a loaded fresh-clone run had the resend answered 1.1 s after the
// try, refused as too late). The
// first copy arrives shortly before the lease's deadline and finds the
// lock its own: it moves the lock's expiry a lease time ahead. When the
// lease ends at its deadline, the lock must not stay behind, held by
// nobody, for most of another second.
func TestResentTryDuringLeaseOutlivesDeadline(t *testing.T) {
	const name = "lock:resent-during"
	srv, admin, holder, tr, l := resentSetup(t, name)
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	tr.arm()
	ls, err := l.Acquire(ctx(t), name, fence.TTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !tr.holding() {
		t.Fatal("the try was not held in transit")
	}
	waitFor(t, func() bool { return time.Until(ls.Deadline()) < 150*time.Millisecond })
	deliverLate(t, admin, tr)
	select {
	case <-ls.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	ended := time.Now()
	o := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	next, err := lockerWith(t, srv.Client(t), o).Acquire(ctx(t), name, fence.Wait(2*time.Second), fence.TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = next.Release(ctx(t)) }()
	if d := time.Since(ended); d > 300*time.Millisecond {
		t.Fatalf("the lease ended at its deadline, unreleased; the next Acquire got the lock %v later (its first try, arriving during the lease, moved the lock's expiry past the deadline)", d.Round(time.Millisecond))
	}
}

// TestSyncedTryShortReadTimeout: with replica sync and a replica
// cut off, the WAIT pipelined after the try holds for the sync timeout. It
// was 1 s here, longer than the client's ReadTimeout (300 ms): go-redis
// timed out the read and sent the script and its WAIT again, three more
// times, and the Acquire returned the client's i/o timeout. New now refuses
// such a timeout (TestSyncTimeoutWithinReadTimeout), and the default fits
// inside the read timeout: the Acquire must return the sync refusal, and
// the lock must be freed at once (not held for the lease time, a minute),
// nor left to the owner of an Acquire that returned.
func TestSyncedTryShortReadTimeout(t *testing.T) {
	const name = "lock:resent-synced"
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	c := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{})
	if err := fence.Run(ctx(t), l, "warm-up", func(context.Context, fence.Lease) error { return nil }); err != nil {
		t.Fatal(err) // the Locker has seen its replica
	}
	redistest.CutLink(t, primary, replica)
	start := time.Now()
	ls, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err == nil {
		_ = ls.Release(ctx(t))
		t.Fatal("acquired with the replica cut off")
	}
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Errorf("Acquire with the replica cut off = %v after %v; want fence.ErrNotReplicated", err, time.Since(start).Round(time.Millisecond))
	}
	waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey(name)).Val() == 0 })
}

// TestResentRingTryAfterRelease: on a Ring (ReplicaSync off: the try goes
// through the Ring, which sends it again after the shard's read timed
// out), a plain Acquire's try is delayed in transit; the resend takes the
// lock, the lease is released, then the first copy arrives: it must
// refuse rather than take the lock for a minute.
func TestResentRingTryAfterRelease(t *testing.T) {
	const name = "lock:resent-ring"
	srv := redistest.Start(t)
	admin := srv.Client(t)
	tr := &transit{match: []byte(lockKey(name))}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr}, Dialer: tr.dial, ReadTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = ring.Close() })
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	l := lockerWith(t, ring, opts)
	if err := fence.Run(ctx(t), l, "warm-up", func(context.Context, fence.Lease) error { return nil }); err != nil {
		t.Fatal(err) // (the scripts are loaded)
	}
	tr.arm()
	ls, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !tr.holding() {
		t.Fatal("the try was not held in transit")
	}
	if err := ls.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	deliverLate(t, admin, tr)
	freeWithin(t, srv, admin, name, "after a Ring's resent try took the lock, was released, and its first copy ran")
}
