package redlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// After a Release decided at a majority with a node paused, another Locker
// acquires at once (a majority is free) with a larger token, and the paused
// node's background release, run when it wakes, leaves the newer holder's
// lock alone (release.lua checks the owner). The same Locker can acquire the
// name again too.
func TestReleaseThenAcquireWithPausedNode(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "release-then-acquire", 30 * time.Second
	l := lateLocker(t, srvs, name)
	other := lateLocker(t, srvs, name)
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	resume := pause(t, srvs[2:])
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	next := acquireFast(t, other, name, ttl)
	if next.Token() <= lease.Token() {
		t.Fatalf("token %d after %d", next.Token(), lease.Token())
	}
	resume()
	// The paused node's release runs now; the newer lock stays on a majority.
	if err := next.Extend(ctxFor(t), ttl); err != nil {
		t.Fatalf("Extend of the newer lease after the old release ran: %v", err)
	}
	if on := lockedOn(t, srvs[:2], name); len(on) != 2 {
		t.Fatalf("newer lease locked on %v of the running nodes, want both", on)
	}
	if err := next.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release of the newer lease: %v", err)
	}
	again := acquireFast(t, l, name, ttl)
	if again.Token() <= next.Token() {
		t.Fatalf("token %d after %d", again.Token(), next.Token())
	}
	if err := again.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
}

// Release with a context already cancelled ends the lease and never
// returns nil while the lock may still be held on a majority; whatever it
// returns, a later Release with a live context concludes, and nothing is
// left locked.
func TestReleaseWithCancelledContext(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "release-cancelled", 30 * time.Second
	l := lateLocker(t, srvs, name)
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	ctx, cancel := context.WithCancel(ctxFor(t))
	cancel()
	err = lease.Release(ctx)
	if err == nil {
		if on := lockedOn(t, srvs, name); len(on) >= 2 {
			t.Fatalf("Release returned nil while locked on %v", on)
		}
	}
	if lease.Err() == nil {
		t.Fatalf("lease not ended after Release: %v", err)
	}
	// The first call's requests go on in the background and delete the
	// lock: the retry must not report the lease lost for it.
	if err2 := lease.Release(ctxFor(t)); err2 != nil {
		t.Fatalf("second Release (first returned %v): %v", err, err2)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
}
