package fencerueidis_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// Attacks on a WAIT that fails after its script ran (redisconn.ErrWait):
// on a renewal, on a try that found the lock held by another owner, and
// with the caller's deadline ending between the script's reply and WAIT's.

// appClient returns a rueidis client of srv logged in as a user "app" that
// may run everything but the commands in deny (ACL categories or names,
// "-wait"), and an admin go-redis client.
func appClient(t *testing.T, srv *redistest.Server, deny ...string) (rueidis.Client, *redis.Client) {
	t.Helper()
	admin := srv.Client(t)
	args := []any{"ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all"}
	for _, d := range deny {
		args = append(args, d)
	}
	if err := admin.Do(ctx(t), args...).Err(); err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, Username: "app", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, admin
}

// TestWaitDeniedOnRenewal: WAIT starts being refused (an ACL change) while
// a lease taken with replica sync is held. Extend must fail without
// ending the lease and without giving the lock back: the lock is still
// the holder's until its deadline, and no other owner may take it. Then
// Release must delete it.
func TestWaitDeniedOnRenewal(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	c, admin := appClient(t, primary)
	l := newLocker(t, c, redislock.Options{})
	lease, err := l.Acquire(ctx(t), "renew-denied", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx(t), "ACL", "SETUSER", "app", "-wait").Err(); err != nil {
		t.Fatal(err)
	}
	err = lease.Extend(ctx(t), time.Minute)
	if err == nil || errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend with WAIT denied = %v; want an error that does not end the lease", err)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("the lease ended after a renewal whose WAIT was denied: %v", err)
	}
	if admin.Exists(ctx(t), lockKey("renew-denied")).Val() != 1 {
		t.Fatal("the lock was given back after a renewal whose WAIT was denied, while its lease runs")
	}
	other := newLocker(t, client(t, primary.Addr), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if l2, err := other.Acquire(ctx(t), "renew-denied", fence.TTL(time.Minute)); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("another owner's Acquire during the lease = %v, %v; want fence.ErrHeld", l2, err)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatalf("Release after the denied renewal = %v", err)
	}
	if admin.Exists(ctx(t), lockKey("renew-denied")).Val() != 0 {
		t.Fatal("the lock is still there after Release")
	}
}

// TestWaitDeniedOnHeldLock: with WAIT denied, a try that finds the lock
// held by another owner fails (the script ran, its WAIT did not), and the
// lock given back must be only this owner's: the holder's lock, token and
// lease stay as they were, with and without a wait budget.
func TestWaitDeniedOnHeldLock(t *testing.T) {
	srv := redistest.Start(t)
	c, admin := appClient(t, srv, "-wait")
	holderLocker, err := redislock.New(admin, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	holder, err := holderLocker.Acquire(ctx(t), "held-denied", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	before := admin.Get(ctx(t), lockKey("held-denied")).Val()
	l := newLocker(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}})
	for _, wait := range []time.Duration{0, 2 * time.Second} {
		_, err := l.Acquire(ctx(t), "held-denied", fence.TTL(time.Minute), fence.Wait(wait))
		if !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("Acquire (wait %v) = %v; want fence.ErrNotAcquired", wait, err)
		}
		// The give-back runs in the background: wait until it has been
		// sent, then look that nothing of the holder's changed.
		gctx, cancel := context.WithTimeout(ctx(t), 10*time.Second)
		err = l.WaitGiveBacks(gctx)
		cancel()
		if err != nil {
			t.Fatalf("wait %v: the give-back not sent in 10 s: %v", wait, err)
		}
		if got := admin.Get(ctx(t), lockKey("held-denied")).Val(); got != before {
			t.Fatalf("wait %v: the holder's lock went from %q to %q", wait, before, got)
		}
		if err := holder.Extend(ctx(t), time.Minute); err != nil {
			t.Fatalf("wait %v: the holder's Extend after the denied try = %v", wait, err)
		}
	}
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatalf("the holder's Release = %v", err)
	}
}

// TestDeadlineBetweenScriptAndWait: the caller's deadline ends while WAIT
// blocks (the primary is expected to have a replica it has not: WAIT
// waits its whole timeout, 5 s), after the script took the lock. Acquire
// must return by the deadline, and the lock must not stay held by nobody
// for its lease time (a minute).
func TestDeadlineBetweenScriptAndWait(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	c := client(t, srv.Addr)
	// Load the scripts (an EVALSHA refused NOSCRIPT would be the one
	// followed by the blocking WAIT, and the script would never run).
	warm := newLocker(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if lease, err := warm.Acquire(ctx(t), "warm", fence.TTL(time.Minute)); err != nil {
		t.Fatal(err)
	} else if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 5 * time.Second}})
	for i, wait := range []time.Duration{0, 200 * time.Millisecond} {
		name := fmt.Sprintf("deadline-wait-%d", i)
		c, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		_, err := l.Acquire(c, name, fence.TTL(time.Minute), fence.Wait(wait))
		cancel()
		if took := time.Since(start); took > time.Second {
			t.Errorf("wait %v: Acquire took %v with a 300 ms deadline", wait, took)
		}
		if !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("wait %v: Acquire = %v; want fence.ErrNotAcquired", wait, err)
		}
		awaitGone(t, admin, name, 10*time.Second, fmt.Sprintf("wait %v: the lock taken before the deadline ended WAIT", wait))
	}
}
