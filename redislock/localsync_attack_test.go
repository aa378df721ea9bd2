package redislock_test

import (
	"errors"
	"runtime"
	"sync"
	"syscall"
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

// TestLocalSyncContentionCutAndRestored: goroutines of two Lockers (two
// processes) with replica sync contend for one lock while the replica is
// in sync, cut off, and back. Never two holders at once; tokens strictly
// increase in the order the holders held the lock; every Acquire ends
// within its budget (and a bound of the sync timeout); an Acquire begun
// after the replica was cut off never returns a lease while it is cut
// off (its grant or take was written after the cut, and no replica can
// have acknowledged it); and after the replica is back, the lock is
// taken again.
func TestLocalSyncContentionCutAndRestored(t *testing.T) {
	primary, replica, l, _, _ := syncedPair(t)
	other := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
	const name = "lock:local-contention"
	const budget, ttl = 1500 * time.Millisecond, time.Second

	var (
		mu        sync.Mutex
		holders   int
		last      fence.Token
		taken     int       // leases returned
		cutAt     time.Time // zero until the replica is cut off
		restoring bool      // the replica is being continued
		ended     int       // Acquires begun after cutAt that ended while cut
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	worker := func(lk *redislock.Locker) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			began := time.Now()
			ls, err := lk.Acquire(ctx(t), name, fence.Wait(budget), fence.TTL(ttl))
			took := time.Since(began)
			if took > budget+time.Second {
				t.Errorf("Acquire took %v, budget %v (%v)", took, budget, err)
			}
			mu.Lock()
			afterCut := !cutAt.IsZero() && began.After(cutAt) && !restoring
			if afterCut {
				ended++
			}
			if err != nil {
				mu.Unlock()
				if !errors.Is(err, fence.ErrNotAcquired) {
					t.Errorf("Acquire = %v", err)
				}
				continue
			}
			holders++
			if holders != 1 {
				t.Errorf("%d holders at once", holders)
			}
			if ls.Token() <= last {
				t.Errorf("token %d after %d", ls.Token(), last)
			}
			last = ls.Token()
			taken++
			if afterCut {
				t.Errorf("lease of token %d returned to an Acquire begun after the replica was cut off, while it is", ls.Token())
			}
			mu.Unlock()
			runtime.Gosched() // holding: another holder now would count 2
			mu.Lock()
			holders--
			mu.Unlock()
			if err := ls.Release(ctx(t)); err != nil {
				t.Errorf("Release of token %d: %v", ls.Token(), err)
			}
		}
	}
	for i := range 6 {
		wg.Add(1)
		if i < 4 {
			go worker(l)
		} else {
			go worker(other)
		}
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	count := func(f func() bool) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return f() }
	}
	waitFor(t, count(func() bool { return taken >= 30 }))

	redistest.CutLink(t, primary, replica)
	mu.Lock()
	cutAt = time.Now()
	mu.Unlock()
	waitFor(t, count(func() bool { return ended >= 12 }))

	mu.Lock()
	restoring = true
	before := taken
	mu.Unlock()
	replica.Signal(syscall.SIGCONT)
	redistest.WaitReplicated(t, primary, 1)
	waitFor(t, count(func() bool { return taken >= before+30 }))
}
