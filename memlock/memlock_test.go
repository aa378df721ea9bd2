package memlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/memlock"
)

func newLocker(t testing.TB, watchdogTTL time.Duration) *memlock.Locker {
	t.Helper()
	l, err := memlock.New(&memlock.Options{WatchdogTTL: watchdogTTL})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestConformance runs fence's suite in real time: it calls t.Run, which a
// synctest bubble does not allow.
func TestConformance(t *testing.T) {
	const watchdogTTL = 300 * time.Millisecond
	l := newLocker(t, watchdogTTL)
	var observed atomic.Pointer[memlock.Locker] // the last from NewObserved
	fencetest.Run(t, fencetest.Config{
		New: func(testing.TB) fence.Locker { return l }, // one "server"
		Remove: func(_ testing.TB, name string) {
			if !l.Remove(name) {
				if o := observed.Load(); o != nil {
					o.Remove(name)
				}
			}
		},
		// A Locker of its own (the Observer is an option of New), which
		// Remove reaches when l does not have the lock.
		NewObserved: func(t testing.TB, obs fence.Observer) fence.Locker {
			o, err := memlock.New(&memlock.Options{WatchdogTTL: watchdogTTL, Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			observed.Store(o)
			return o
		},
		WatchdogTTL: watchdogTTL,
	})
}

func TestNew(t *testing.T) {
	for _, bad := range []time.Duration{-time.Second, time.Microsecond} {
		if _, err := memlock.New(&memlock.Options{WatchdogTTL: bad}); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("New(WatchdogTTL %v) = %v, want ErrInvalidOption", bad, err)
		}
	}
	if _, err := memlock.New(nil); err != nil {
		t.Fatalf("New(nil) = %v", err)
	}
}

// The zero Locker works, with the default watchdog TTL.
func TestZeroValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l memlock.Locker
		lease, err := l.Acquire(t.Context(), "zero")
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Until(lease.Deadline()); got != memlock.DefaultWatchdogTTL {
			t.Fatalf("deadline in %v, want %v", got, memlock.DefaultWatchdogTTL)
		}
		time.Sleep(time.Hour)
		if lease.Err() != nil {
			t.Fatalf("watchdog lease ended: %v", lease.Err())
		}
		mustRelease(t, lease)
	})
}

func mustAcquire(t testing.TB, l fence.Locker, name string, opts ...fence.Option) fence.Lease {
	t.Helper()
	lease, err := l.Acquire(context.Background(), name, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", name, err)
	}
	return lease
}

func mustRelease(t testing.TB, lease fence.Lease) {
	t.Helper()
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("Release(%q): %v", lease.Name(), err)
	}
}

func isDone(lease fence.Lease) bool {
	select {
	case <-lease.Done():
		return true
	default:
		return false
	}
}

// A fixed lease ends exactly at its deadline, and its lock is free then.
func TestExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, time.Second)
		start := time.Now()
		a := mustAcquire(t, l, "n", fence.TTL(10*time.Second))
		if !a.Deadline().Equal(start.Add(10 * time.Second)) {
			t.Fatalf("deadline %v, want start + 10s", a.Deadline().Sub(start))
		}
		time.Sleep(10*time.Second - time.Nanosecond)
		if isDone(a) || a.Err() != nil {
			t.Fatalf("lease ended before its deadline: %v", a.Err())
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if !isDone(a) || !errors.Is(a.Err(), fence.ErrLeaseLost) {
			t.Fatalf("at its deadline: done %v, Err %v; want done and ErrLeaseLost", isDone(a), a.Err())
		}
		if !errors.Is(context.Cause(a.Context()), fence.ErrLeaseLost) {
			t.Fatalf("Context cause %v, want ErrLeaseLost", context.Cause(a.Context()))
		}
		b := mustAcquire(t, l, "n", fence.TTL(time.Second))
		if b.Token() <= a.Token() {
			t.Fatalf("token %d after expiry, want > %d", b.Token(), a.Token())
		}
		// The expired lease can neither be extended nor release b's lock.
		for range 2 {
			if err := a.Release(context.Background()); !errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("Release of expired lease = %v, want ErrLeaseLost", err)
			}
		}
		if err := a.Extend(context.Background(), time.Minute); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Extend of expired lease = %v, want ErrLeaseLost", err)
		}
		if b.Err() != nil {
			t.Fatalf("the stale lease ended b: %v", b.Err())
		}
		mustRelease(t, b)
	})
}

// A release hands the lock to a waiter at once: no time passes.
func TestReleaseWakesWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, time.Second)
		a := mustAcquire(t, l, "n", fence.TTL(time.Hour))
		got := make(chan fence.Lease)
		go func() { got <- mustAcquire(t, l, "n", fence.Wait(time.Minute), fence.TTL(time.Hour)) }()
		synctest.Wait() // the waiter is in line
		start := time.Now()
		mustRelease(t, a)
		b := <-got
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("waiter woke %v after the release", waited)
		}
		mustRelease(t, b)
	})
}

// Waiters get the lock in the order they came, each on the previous
// holder's release.
func TestWaitersFirstComeFirstServed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, time.Second)
		holder := mustAcquire(t, l, "n", fence.TTL(time.Hour))
		var mu sync.Mutex
		var order []int
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Go(func() {
				lease := mustAcquire(t, l, "n", fence.Wait(time.Hour), fence.TTL(time.Hour))
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				time.Sleep(time.Second) // work
				mustRelease(t, lease)
			})
			synctest.Wait() // waiter i is in line before i+1 comes
		}
		mustRelease(t, holder)
		wg.Wait()
		for i, w := range order {
			if w != i {
				t.Fatalf("waiters got the lock in order %v", order)
			}
		}
	})
}

// Waiters with different budgets and contexts each end as their own budget
// says, and a waiter that gave up never holds the lock.
func TestMixedBudgets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, time.Second)
		holder := mustAcquire(t, l, "n", fence.TTL(2500*time.Millisecond))
		start := time.Now()
		type outcome struct {
			after time.Duration
			err   error
			lease fence.Lease
		}
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		cases := []struct {
			ctx  context.Context
			wait time.Duration
		}{
			{context.Background(), time.Second},      // gives up at 1 s: ErrHeld
			{ctx, time.Hour},                         // ctx ends at 1.5 s
			{context.Background(), 2 * time.Second},  // gives up at 2 s
			{context.Background(), 3 * time.Second},  // gets it at 2.5 s (expiry)
			{context.Background(), 10 * time.Second}, // gets it when that one releases
		}
		out := make([]outcome, len(cases))
		var wg sync.WaitGroup
		for i, c := range cases {
			wg.Go(func() {
				lease, err := l.Acquire(c.ctx, "n", fence.Wait(c.wait), fence.TTL(time.Second))
				out[i] = outcome{time.Since(start), err, lease}
				if err == nil {
					time.Sleep(500 * time.Millisecond)
					mustRelease(t, lease)
				}
			})
			synctest.Wait()
		}
		wg.Wait()
		if !errors.Is(holder.Err(), fence.ErrLeaseLost) {
			t.Fatalf("holder Err %v, want ErrLeaseLost", holder.Err())
		}
		want := []struct {
			after time.Duration
			err   error
		}{
			{time.Second, fence.ErrHeld},
			{1500 * time.Millisecond, context.DeadlineExceeded},
			{2 * time.Second, fence.ErrHeld},
			{2500 * time.Millisecond, nil},
			{3 * time.Second, nil},
		}
		for i, w := range want {
			o := out[i]
			if o.after != w.after || (w.err == nil) != (o.err == nil) || (w.err != nil && (!errors.Is(o.err, w.err) || !errors.Is(o.err, fence.ErrNotAcquired))) {
				t.Errorf("waiter %d: after %v err %v; want after %v err %v", i, o.after, o.err, w.after, w.err)
			}
		}
		if out[4].lease != nil && out[4].lease.Token() <= out[3].lease.Token() {
			t.Errorf("tokens %d then %d", out[3].lease.Token(), out[4].lease.Token())
		}
		// Nobody holds the lock now.
		mustRelease(t, mustAcquire(t, l, "n"))
	})
}

// A lock freed at the very instant a waiter's budget or context ends is
// either returned to the waiter or left free, never held by nobody.
func TestHandOffAsWaitEnds(t *testing.T) {
	for _, byCtx := range []bool{false, true} {
		t.Run(fmt.Sprintf("ctx=%v", byCtx), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := newLocker(t, time.Second)
				mustAcquire(t, l, "n", fence.TTL(time.Second))
				ctx, wait := context.Background(), time.Second
				if byCtx {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Second)
					defer cancel()
					wait = time.Hour
				}
				lease, err := l.Acquire(ctx, "n", fence.Wait(wait), fence.TTL(time.Hour))
				if err == nil {
					mustRelease(t, lease)
				} else if !errors.Is(err, fence.ErrNotAcquired) {
					t.Fatalf("Acquire = %v", err)
				}
				mustRelease(t, mustAcquire(t, l, "n"))
			})
		})
	}
}

func TestCancelledContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, time.Second)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := l.Acquire(ctx, "n"); !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire(cancelled) = %v, want ErrNotAcquired and Canceled", err)
		}
		// Cancelled while waiting: the caller leaves the line.
		holder := mustAcquire(t, l, "n", fence.TTL(time.Hour))
		ctx, cancel = context.WithCancel(context.Background())
		errc := make(chan error)
		go func() {
			_, err := l.Acquire(ctx, "n", fence.Wait(time.Hour))
			errc <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire cancelled while waiting = %v, want Canceled", err)
		}
		mustRelease(t, holder)
		mustRelease(t, mustAcquire(t, l, "n"))
	})
}

func TestReleaseTwiceAndExtendAfterRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, time.Second)
		lease := mustAcquire(t, l, "n", fence.TTL(time.Minute))
		mustRelease(t, lease)
		mustRelease(t, lease)
		if !errors.Is(lease.Err(), fence.ErrReleased) || !errors.Is(context.Cause(lease.Context()), fence.ErrReleased) {
			t.Fatalf("Err %v, cause %v; want ErrReleased", lease.Err(), context.Cause(lease.Context()))
		}
		err := lease.Extend(context.Background(), time.Minute)
		if !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
			t.Fatalf("Extend after Release = %v, want ErrLeaseLost and ErrReleased", err)
		}
		// Releasing again after someone else took the lock leaves it theirs.
		b := mustAcquire(t, l, "n", fence.TTL(time.Minute))
		mustRelease(t, lease)
		if _, err := l.Acquire(context.Background(), "n"); !errors.Is(err, fence.ErrHeld) {
			t.Fatalf("Acquire = %v, want ErrHeld", err)
		}
		mustRelease(t, b)
	})
}

// Release with a done ctx is not conclusive: the lock stays held and a
// later Release frees it.
// A Release with a done ctx does as the backends do when the server
// cannot be reached (see TestReleaseWithDoneCtxEndsLease): the lease ends
// at once, its lock stays held until its deadline, and Release returns
// ctx's error; Extend cannot revive it.
func TestReleaseWithDoneContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, time.Second)
		lease := mustAcquire(t, l, "n", fence.TTL(time.Minute))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := lease.Release(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Release(cancelled) = %v, want Canceled", err)
		}
		if !errors.Is(lease.Err(), fence.ErrReleased) {
			t.Fatalf("lease Err %v after Release(cancelled), want ErrReleased", lease.Err())
		}
		select {
		case <-lease.Done():
		default:
			t.Fatal("Done open after Release(cancelled)")
		}
		if err := lease.Extend(context.Background(), time.Hour); !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
			t.Fatalf("Extend after Release(cancelled) = %v, want ErrLeaseLost and ErrReleased", err)
		}
		if got := time.Until(lease.Deadline()); got != time.Minute {
			t.Fatalf("Extend after Release(cancelled) moved the deadline to %v from now", got)
		}
		if _, err := l.Acquire(context.Background(), "n"); !errors.Is(err, fence.ErrHeld) {
			t.Fatalf("Acquire after Release(cancelled) = %v, want ErrHeld (the lock held until its deadline)", err)
		}
		mustRelease(t, lease) // retried in time: frees the lock
		mustRelease(t, lease)
		mustRelease(t, mustAcquire(t, l, "n"))
	})
}

// After a Release with a done ctx, the lock is freed at the lease's
// deadline (to a waiter, for a watchdog lease too, which is renewed no
// more), and a Release retried after that reports the lease lost.
func TestReleaseWithDoneContextExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		done, cancel := context.WithCancel(context.Background())
		cancel()
		for _, opts := range [][]fence.Option{{fence.TTL(time.Minute)}, nil} {
			l := newLocker(t, time.Minute)
			lease := mustAcquire(t, l, "n", opts...)
			deadline := lease.Deadline()
			if err := lease.Release(done); !errors.Is(err, context.Canceled) {
				t.Fatalf("Release(done) = %v", err)
			}
			next, err := l.Acquire(context.Background(), "n", fence.Wait(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if at := time.Now(); at.Before(deadline) || at.After(deadline.Add(time.Second)) {
				t.Fatalf("opts %v: the lock was handed over at %v, the failed lease's deadline %v", opts, at, deadline)
			}
			if err := lease.Release(context.Background()); !errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("Release retried after the deadline = %v, want ErrLeaseLost", err)
			}
			if !errors.Is(lease.Err(), fence.ErrReleased) || next.Err() != nil {
				t.Fatalf("old lease Err %v, new %v", lease.Err(), next.Err())
			}
			mustRelease(t, next)
		}
	})
}

// Remove frees the lock of a lease whose Release failed; its retried
// Release then reports it lost, and frees nobody else's lock.
func TestReleaseWithDoneContextRemoved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		l, err := memlock.New(&memlock.Options{Observer: rec})
		if err != nil {
			t.Fatal(err)
		}
		lease := mustAcquire(t, l, "n", fence.TTL(time.Minute))
		done, cancel := context.WithCancel(context.Background())
		cancel()
		_ = lease.Release(done)
		if !l.Remove("n") {
			t.Fatal("Remove: the lock of a failed Release was not held")
		}
		next := mustAcquire(t, l, "n")
		if err := lease.Release(context.Background()); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release after Remove = %v, want ErrLeaseLost", err)
		}
		if next.Err() != nil {
			t.Fatalf("the old lease's Release ended the new holder's: %v", next.Err())
		}
		mustRelease(t, next)
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if want := []fence.LeaseCause{fence.Released, fence.Released}; !slices.Equal(rec.ends, want) {
			t.Errorf("ends reported %v, want %v (the failed Release's once)", rec.ends, want)
		}
	})
}

func TestExtend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, time.Second)
		lease := mustAcquire(t, l, "n", fence.TTL(time.Second))
		if err := lease.Extend(context.Background(), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		if lease.Err() != nil {
			t.Fatalf("extended lease ended early: %v", lease.Err())
		}
		// Shortening works too.
		if err := lease.Extend(context.Background(), time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
			t.Fatalf("Err %v after the shortened lease time, want ErrLeaseLost", lease.Err())
		}
		if err := lease.Extend(context.Background(), time.Second); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Extend after expiry = %v, want ErrLeaseLost", err)
		}
	})
}

func TestWatchdog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, 3*time.Second)
		lease := mustAcquire(t, l, "n")
		time.Sleep(24 * time.Hour)
		if lease.Err() != nil {
			t.Fatalf("watchdog lease ended: %v", lease.Err())
		}
		if got := time.Until(lease.Deadline()); got <= time.Second || got > 3*time.Second {
			t.Fatalf("deadline %v from now, want within the watchdog TTL", got)
		}
		// Extend moves the deadline once; the watchdog goes on after it.
		if err := lease.Extend(context.Background(), time.Hour); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		if lease.Err() != nil {
			t.Fatalf("watchdog lease ended after Extend: %v", lease.Err())
		}
		if !l.Remove("n") {
			t.Fatal("Remove found no lock")
		}
		if !isDone(lease) || !errors.Is(lease.Err(), fence.ErrLeaseLost) {
			t.Fatalf("after Remove: Err %v, want ErrLeaseLost", lease.Err())
		}
		if err := lease.Release(context.Background()); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release after Remove = %v, want ErrLeaseLost", err)
		}
		if l.Remove("n") {
			t.Fatal("Remove of a free lock reported true")
		}
	})
}

func TestContextCarriesValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		l := newLocker(t, time.Second)
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
		lease, err := l.Acquire(ctx, "n", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		if lease.Context().Value(key{}) != "v" || lease.Context().Err() != nil {
			t.Fatalf("lease context: value %v, err %v", lease.Context().Value(key{}), lease.Context().Err())
		}
		mustRelease(t, lease)
	})
}

func TestTokensIncreaseAcrossNames(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, time.Second)
		var last fence.Token
		for i := range 10 {
			lease := mustAcquire(t, l, fmt.Sprintf("n%d", i%3), fence.TTL(time.Second))
			if lease.Token() <= last {
				t.Fatalf("token %d after %d", lease.Token(), last)
			}
			last = lease.Token()
			if i%2 == 0 {
				mustRelease(t, lease)
			} else {
				time.Sleep(time.Second) // let it expire
			}
		}
	})
}

// Many goroutines with random budgets and cancellations in real time: never
// two holders, and every lock is free at the end.
func TestStress(t *testing.T) {
	l := newLocker(t, 50*time.Millisecond)
	var inside atomic.Int32
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 30 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%4)*time.Millisecond)
				opts := []fence.Option{fence.Wait(time.Duration(g%3) * time.Millisecond)}
				if g%2 == 0 {
					opts = append(opts, fence.TTL(time.Second))
				}
				lease, err := l.Acquire(ctx, "n", opts...)
				cancel()
				if err != nil {
					if !errors.Is(err, fence.ErrNotAcquired) {
						t.Errorf("Acquire = %v", err)
					}
					continue
				}
				if inside.Add(1) != 1 {
					t.Error("two holders")
				}
				inside.Add(-1)
				if err := lease.Release(context.Background()); err != nil {
					t.Errorf("Release = %v", err)
				}
			}
		})
	}
	wg.Wait()
	mustRelease(t, mustAcquire(t, l, "n"))
}

func TestInvalidInput(t *testing.T) {
	l := newLocker(t, time.Second)
	if _, err := l.Acquire(context.Background(), "a{b"); !errors.Is(err, fence.ErrInvalidName) {
		t.Errorf("Acquire(a{b) = %v, want ErrInvalidName", err)
	}
	lease := mustAcquire(t, l, "n", fence.TTL(time.Minute))
	if err := lease.Extend(context.Background(), 0); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("Extend(0) = %v, want ErrInvalidOption", err)
	}
	mustRelease(t, lease)
}

// Every method of one lease, called at once from many goroutines while the
// lock is removed and retaken: the race detector watches, and every Release
// agrees on one result.
func TestLeaseConcurrentUse(t *testing.T) {
	l := newLocker(t, 30*time.Millisecond)
	for range 20 {
		lease := mustAcquire(t, l, "n")
		var wg sync.WaitGroup
		results := make([]error, 8)
		for i := range 8 {
			wg.Go(func() {
				_ = lease.Extend(context.Background(), time.Second)
				_, _ = lease.Deadline(), lease.Err()
				results[i] = lease.Release(context.Background())
			})
		}
		wg.Go(func() { l.Remove("n") })
		wg.Wait()
		for _, err := range results[1:] {
			if (err == nil) != (results[0] == nil) {
				t.Fatalf("Release results differ: %v and %v", results[0], err)
			}
		}
		if results[0] != nil && !errors.Is(results[0], fence.ErrLeaseLost) {
			t.Fatalf("Release = %v", results[0])
		}
		mustRelease(t, mustAcquire(t, l, "n"))
	}
}
