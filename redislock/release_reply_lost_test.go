package redislock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// A Release whose script ran but whose reply was lost with its connection:
// go-redis sends the script again on a fresh connection (MaxRetries, 3 by
// default), and that second run finds the lock gone, or granted already to
// the waiter in line. The Release happened, so it returns nil (the release
// script's record of the owner whose release last deleted the lock). Before
// that record, it returned an error matching fence.ErrLeaseLost in both
// cases: "fence: lease lost: ... was removed or taken by another owner".
// With MaxRetries -1 the Release returns the connection's error, and
// Release again returns nil.
func TestReleaseReplyLostWithConnection(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	for _, tc := range []struct {
		name    string
		retries int // 0: go-redis's default, 3
		waiter  bool
	}{
		{"resent", 0, false},
		{"resent, granted to a waiter", 0, true},
		{"not resent", -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "lock:release-reply-lost:" + tc.name
			d := redistest.NewDropper(lockKey(name))
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: d.Dial, MaxRetries: tc.retries})
			t.Cleanup(func() { _ = c.Close() })
			l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
			// Once first, so that the release script is loaded: an
			// EVALSHA refused with NOSCRIPT has not run.
			if err := acquire(t, l, name, fence.TTL(time.Minute)).Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
			lease := acquire(t, l, name, fence.TTL(time.Minute))
			var got <-chan acquired
			if tc.waiter {
				other := lockerWith(t, srv.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
				got = acquireAsync(other, name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
				waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 })
			}
			d.Arm()
			err := lease.Release(ctx(t))
			if d.Dropped() != 1 {
				t.Fatalf("%d replies dropped, want the release's", d.Dropped())
			}
			if tc.waiter {
				r := acquired{}.wait(t, got)
				if r.err != nil {
					t.Fatalf("the waiter: %v", r.err)
				}
				defer func() { _ = r.lease.Release(context.Background()) }()
			} else if n := admin.Exists(ctx(t), lockKey(name)).Val(); n != 0 {
				t.Fatalf("the lock is still there after the Release (%v)", err)
			}
			if tc.retries == 0 {
				if err != nil {
					t.Fatalf("Release sent again by go-redis, its first run's reply lost = %v, want nil", err)
				}
				return
			}
			if err == nil || errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("Release with MaxRetries -1, its reply lost = %v, want the connection's error", err)
			}
			if err := lease.Release(ctx(t)); err != nil {
				t.Fatalf("Release again, after the one whose reply was lost = %v, want nil", err)
			}
		})
	}
}

// The record of the owner whose release last deleted the lock answers for
// that owner alone: a lease whose lock was removed behind it, after another
// lease's release left the record, still hears that it lost the lock,
// whether the lock is free or held by another.
func TestReleasedByRecordIsTheOwnersAlone(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	l := lockerWith(t, srv.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:released-by-alone"
	for _, taken := range []bool{false, true} {
		if err := acquire(t, l, name, fence.TTL(time.Minute)).Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if admin.Exists(ctx(t), lockKey(name)+":released-by").Val() != 1 {
			t.Fatal("no released-by record after a Release")
		}
		lease := acquire(t, l, name, fence.TTL(time.Minute))
		admin.Del(ctx(t), lockKey(name))
		if taken {
			other := acquire(t, l, name, fence.TTL(time.Minute))
			defer func() { _ = other.Release(context.Background()) }()
		}
		if err := lease.Release(ctx(t)); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release of a lease whose lock was removed (taken since: %v) = %v, want an error matching fence.ErrLeaseLost", taken, err)
		}
	}
}

// The same resend when the lock goes to a waiter of the releasing Locker,
// with replica sync and a replica: the release goes with WAIT, and the
// waiter holds back the grant it sees until the release's reply says whom
// it granted (see Locker.releaseLease). The resend's reply (1, from the
// record) names nobody, so the waiter confirms the grant with a try of its
// own once the call is done. Before the record the Release returned an error matching
// fence.ErrLeaseLost ("... was removed or taken by another owner").
func TestReleaseReplyLostGrantedToOwnWaiter(t *testing.T) {
	srv := redistest.Start(t)
	redistest.StartReplica(t, srv)
	redistest.WaitReplicated(t, srv, 1)
	admin := srv.Client(t)
	const name = "lock:release-reply-lost-own-waiter"
	d := redistest.NewDropper(lockKey(name))
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: d.Dial})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{})
	if err := acquire(t, l, name, fence.TTL(time.Minute)).Release(ctx(t)); err != nil {
		t.Fatal(err) // loads the release script: an EVALSHA refused with NOSCRIPT has not run
	}
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	got := acquireAsync(l, name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
	waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 })
	d.Arm()
	err := lease.Release(ctx(t))
	released := time.Now()
	if d.Dropped() != 1 {
		t.Fatalf("%d replies dropped, want the release's", d.Dropped())
	}
	r := acquired{}.wait(t, got)
	took := time.Since(released)
	if err != nil {
		t.Fatalf("Release sent again by go-redis, its first run's reply lost = %v, want nil", err)
	}
	if r.err != nil {
		t.Fatalf("the waiter of the same Locker: %v", r.err)
	}
	// It holds a grant back for as long as the release is on its way, at
	// most 2 s (twice the default sync timeout): 1 s leaves a loaded
	// machine slack.
	if took > time.Second {
		t.Fatalf("the waiter took its lock %v after the Release returned", took)
	}
}

// A Release whose script ran, whose reply was lost with its connection a
// while later (a read that blocked until the link died, up to the client's
// ReadTimeout, 3 s by default), and that go-redis sent again, while the
// waiter the first run granted the lock to took it and released it: that
// release overwrote the record of the owner whose release last deleted the
// lock, so the resend finds neither the lock nor its record and the Release
// returns an error matching fence.ErrLeaseLost ("fence: lease lost: ... was
// removed or taken by another owner"), though it released the lock. On a
// lock that others wait for, the window is the resend's delay, not a few
// milliseconds: the waiter needs only one round trip of its own.
func TestReleaseReplyLostAfterTheWaitersRelease(t *testing.T) {
	t.Skip("design question: the record is one key per lock name, which the next holder's release overwrites. " +
		"A mark per release on a lock others wait for (P:{N}:revoked:O = 'r' for 10 s, 046e50c) made this pass, but cost " +
		"4-5% of the contended holder changes/s (BenchmarkContended, against rueidislock in the same run: 1.58x sync off, " +
		"1.13x sync on, against 1.62x and 1.18x without it): a new key per handoff, and its expiry, replicated as a DEL. " +
		"Reverted; the package doc says this case is not covered")
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:release-reply-lost-late"
	// The reply is lost once let is closed: a link that died a while
	// after the reply left the server.
	d, let := redistest.NewDropper(lockKey(name)), make(chan struct{})
	d.Until(let)
	var letGo sync.Once
	t.Cleanup(func() { letGo.Do(func() { close(let) }) }) // a failure below does not leave the Release hanging
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: d.Dial})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err := acquire(t, l, name, fence.TTL(time.Minute)).Release(ctx(t)); err != nil {
		t.Fatal(err) // loads the release script: an EVALSHA refused with NOSCRIPT has not run
	}
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	other := lockerWith(t, srv.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	got := acquireAsync(other, name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
	waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 })
	d.Arm()
	released := make(chan error, 1)
	go func() { released <- lease.Release(ctx(t)) }()
	r := acquired{}.wait(t, got) // granted by the Release's first run
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	if err := r.lease.Release(ctx(t)); err != nil {
		t.Fatalf("the waiter's Release: %v", err)
	}
	letGo.Do(func() { close(let) }) // now the first Release's connection breaks, and go-redis sends it again
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("Release whose first run released the lock, its reply lost after the next holder's release = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Release has not returned 10 s after its connection broke")
	}
}

// A lock whose expiry was taken away by hand (PERSIST, or a copy made
// with DUMP and RESTORE without its TTL) while a lease held it: the
// lease's Release renames it to the released-by record, which keeps the
// lock's lack of expiry, and lives until the name's next release (if any)
// overwrites it: a key per such name that never expires, where the DEL of
// releases before 7fc6481 left nothing (run with the skip taken out: "the
// released-by record has no expiry (PTTL -1ns)").
func TestReleasedByRecordOfPersistentLockExpires(t *testing.T) {
	t.Skip("design question: giving the record an expiry when the lock had none (PEXPIRE ... NX after the RENAME) " +
		"costs every release one more call in the script (scripttime.md's parts: 0.2-0.4 us each, against about 1 us " +
		"for the record itself), for a lock that only an operator or another program can have made persistent; " +
		"fence never writes a lock without expiry (heldErr)")
	srv := redistest.Start(t)
	admin := srv.Client(t)
	l := lockerWith(t, srv.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:released-by-persistent"
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	if !admin.Persist(ctx(t), lockKey(name)).Val() {
		t.Fatal("PERSIST of the held lock did nothing")
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatalf("Release of a lease whose lock was made persistent: %v", err)
	}
	if ttl := admin.PTTL(ctx(t), lockKey(name)+":released-by").Val(); ttl < 0 {
		t.Fatalf("the released-by record has no expiry (PTTL %v)", ttl)
	}
}
