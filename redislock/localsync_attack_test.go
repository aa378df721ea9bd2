package redislock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// Attacks on the synced local handoff (Locker.releaseLease, handing,
// handed, taken): a Release of a Locker with a waiting Acquire sends WAIT
// with the release script, and a waiter that needs its grant confirmed
// holds it back while such a release is in flight.

// TestHoldOffEndsWhenLocalReleaseHangs: a Release of this Locker whose
// request is stuck on its way (a held write; the client's read timeout is
// long) is in flight with WAIT when another process's release grants the
// lock to this Locker's waiter. The stuck release did not make that grant
// and cannot cover it; the waiter must not hold the grant back until its
// budget ends (the lock it was granted would be held by nobody for that
// long, and the Acquire would fail with ErrHeld): it confirms the grant
// itself, within a bound of the sync timeout.
func TestHoldOffEndsWhenLocalReleaseHangs(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	h := redistest.NewHolder("\r\nWAIT\r\n")
	client := redis.NewClient(&redis.Options{Addr: primary.Addr, Dialer: h.Dial, ReadTimeout: 20 * time.Second})
	t.Cleanup(func() { _ = client.Close() })
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}}
	l := lockerWith(t, client, opts)
	admin := primary.Client(t)
	other := lockerWith(t, primary.Client(t), opts) // another process
	const name = "lock:holdoff-stuck-release"

	// A lease of l that has expired: its Release runs the script
	// owner-checked (it deletes nothing), with WAIT while l has a waiter.
	stale, err := l.Acquire(ctx(t), name, fence.TTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-stale.Done()
	awaitUnlocked(t, admin, name, 5*time.Second, "the stale lease's TTL")
	holder := acquire(t, other, name, fence.TTL(time.Minute))
	const budget = 4 * time.Second
	start := time.Now()
	leases, errs := queuedLocal(t, l, admin, name, budget, 2*time.Second)

	h.Arm()
	released := make(chan error, 1)
	go func() { released <- stale.Release(ctx(t)) }()
	waitFor(t, func() bool { return h.Held() == 1 })
	h.Disarm()
	t.Cleanup(func() { _ = h.Let() })

	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case ls := <-leases:
		defer func() { _ = ls.Release(ctx(t)) }()
		if ls.Token() <= holder.Token() {
			t.Fatalf("token %d after %d", ls.Token(), holder.Token())
		}
	case err := <-errs:
		t.Fatalf("Acquire = %v after %v, want the lease granted to it (its grant was held back for a release that could not cover it)", err, time.Since(start).Round(time.Millisecond))
	}
	_ = h.Let()
	if err := <-released; err != nil && !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("the stale lease's Release = %v", err)
	}
}
