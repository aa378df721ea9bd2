package redislock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// reentrant is an Observer that calls back into its Locker: when an
// Acquire succeeds, AcquireDone tries the same lock again (no wait: it is
// held, by the lease being returned); when a lease is lost, LeaseEnded
// releases it and waits for the lock again; when one is released (and the
// release may just have handed the lock to a waiter of the same Locker),
// LeaseEnded tries the lock once (unless that lease was one it took).
type reentrant struct {
	fence.NopObserver
	t      *testing.T
	l      atomic.Pointer[redislock.Locker]
	name   string
	leases sync.Map // token → fence.Lease, once Acquire returned it
	nested sync.Map // tokens of the leases LeaseEnded took
	check  *holdChecker
	ended  atomic.Int32 // LeaseEnded calls done
	leased atomic.Int32 // leases l returned
	stolen atomic.Int32 // nested tries that took the lock
}

func (o *reentrant) AcquireDone(ev fence.AcquireEvent) {
	if ev.Result != fence.Acquired {
		return
	}
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if ls, err := o.l.Load().Acquire(c, o.name, fence.TTL(time.Second)); err == nil {
		o.t.Errorf("AcquireDone of token %d: the same lock taken again (token %d) while it is being returned", ev.Token, ls.Token())
		_ = ls.Release(c)
	} else if !errors.Is(err, fence.ErrHeld) {
		o.t.Errorf("AcquireDone of token %d: a try of the lock just taken: %v, want ErrHeld", ev.Token, err)
	}
}

func (o *reentrant) LeaseEnded(ev fence.LeaseEvent) {
	// A lease lost at its deadline is reported on its timer's goroutine,
	// maybe after its holder's Release returned: the test waits for
	// every lease's report to be done.
	defer o.ended.Add(1)
	if _, ok := o.nested.Load(ev.Token); ok {
		// A lease taken here: trying again when it ends would go on for
		// as long as the lock is free (each lease taking the next, inside
		// the Release of the one before), a loop of the test's making.
		return
	}
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ev.Cause != fence.Released {
		if v, ok := o.leases.Load(ev.Token); ok {
			if err := v.(fence.Lease).Release(c); !errors.Is(err, fence.ErrLeaseLost) {
				o.t.Errorf("Release from LeaseEnded (%s) of token %d: %v, want ErrLeaseLost", ev.Cause, ev.Token, err)
			}
		}
	}
	wait := time.Duration(0)
	if ev.Cause != fence.Released {
		wait = 300 * time.Millisecond
	}
	start := time.Now()
	ls, err := o.l.Load().Acquire(c, o.name, fence.Wait(wait), fence.TTL(200*time.Millisecond))
	if took := time.Since(start); took > wait+500*time.Millisecond {
		o.t.Errorf("Acquire from LeaseEnded (wait %v) took %v", wait, took)
	}
	if err != nil {
		if !errors.Is(err, fence.ErrHeld) {
			o.t.Errorf("Acquire from LeaseEnded: %v", err)
		}
		return
	}
	o.nested.Store(ls.Token(), true)
	o.stolen.Add(1)
	o.leased.Add(1)
	o.check.took(ls)
	o.check.done(ls)
	if err := ls.Release(c); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
		o.t.Errorf("release of a lease taken in LeaseEnded: %v", err)
	}
}

// TestObserverReentersLocalHandoff: with replica sync on, waiters of one
// Locker queue for a lock and hand it to each other (the local handoff:
// the release's WAIT covers the grant), while its Observer calls back
// into the Locker from AcquireDone and LeaseEnded (see reentrant); some
// leases are held past their TTL, and are lost. No two leases may be held
// at once, tokens increase, nothing hangs or deadlocks, and nothing is
// left in Redis.
func TestObserverReentersLocalHandoff(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	const name, n = "lock:reentrant", 24
	check := newHoldChecker(t)
	obs := &reentrant{t: t, name: name, check: check}
	l := lockerWith(t, primary.Client(t), redislock.Options{Observer: obs, ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
	obs.l.Store(l)
	other := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 1))
	holder := acquire(t, l, name, fence.TTL(time.Minute))
	obs.leased.Add(1)
	var wg sync.WaitGroup
	// A failure below must not leave the waiters to report after the
	// test has ended (a panic of the whole package's run).
	t.Cleanup(wg.Wait)
	var returned atomic.Int64 // waiters whose Acquire has returned
	for i := range n {
		ttl := 150*time.Millisecond + dur(rnd, 300*time.Millisecond)
		hold := dur(rnd, 200*time.Millisecond) // past ttl sometimes: lost
		budget := 2*time.Second + dur(rnd, 3*time.Second)
		locker := l
		if i%4 == 3 {
			locker = other
		}
		wg.Go(func() {
			c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			ls, err := locker.Acquire(c, name, fence.Wait(budget), fence.TTL(ttl))
			returned.Add(1)
			if took := time.Since(start); took > budget+time.Second {
				t.Errorf("waiter %d: returned after %v, budget %v", i, took, budget)
			}
			if err != nil {
				if !errors.Is(err, fence.ErrHeld) {
					t.Errorf("waiter %d: %v", i, err)
				}
				return
			}
			obs.leases.Store(ls.Token(), ls)
			if locker == l {
				obs.leased.Add(1)
			}
			check.took(ls)
			timer := time.NewTimer(hold)
			<-timer.C
			check.done(ls)
			if err := ls.Release(c); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
				t.Errorf("waiter %d: release: %v", i, err)
			}
		})
	}
	// Every waiter queued, or (a loaded machine: a budget of 2 s ran out
	// before the last queued; it failed so once) gave up.
	waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val()+returned.Load() >= n })
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	// Every lease of l reports its end once (the holder's too).
	waitFor(t, func() bool { return obs.ended.Load() == obs.leased.Load() })
	t.Logf("%d leases, %d taken from LeaseEnded", check.leases, obs.stolen.Load())
	waitFor(t, func() bool {
		n, err := admin.Exists(ctx(t), lockKey(name), lockKey(name)+":queue", lockKey(name)+":waiters").Result()
		return err == nil && n == 0
	})
}
