package fence_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// lateLocker returns the first `late` leases once their deadline has
// passed, as redislock's Acquire did when the try that took the lock was
// answered more than the lease time after it was sent (the lease's
// deadline counts from the send): a redis-server starved on a loaded
// machine, or paused. It counts the Acquires, and the Releases of the
// leases it returned late.
type lateLocker struct {
	fence.Locker
	late     int
	mu       sync.Mutex
	calls    []time.Time // when each Acquire was called
	acquires []time.Time // when each Acquire returned
	released atomic.Int32
}

type countedLease struct {
	fence.Lease
	released *atomic.Int32
}

func (c countedLease) Release(ctx context.Context) error {
	c.released.Add(1)
	return c.Lease.Release(ctx)
}

func (l *lateLocker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	l.mu.Lock()
	l.calls = append(l.calls, time.Now())
	l.mu.Unlock()
	lease, err := l.Locker.Acquire(ctx, name, opts...)
	l.mu.Lock()
	n := len(l.acquires)
	l.mu.Unlock()
	if err == nil && n < l.late {
		time.Sleep(time.Until(lease.Deadline()) + time.Millisecond) // the bubble's clock
		synctest.Wait()
		lease = countedLease{lease, &l.released}
	}
	l.mu.Lock()
	l.acquires = append(l.acquires, time.Now())
	l.mu.Unlock()
	return lease, err
}

// Run called fn with a lease that ended before Acquire returned.
// TestLeadRedis's removals found no lock right after a term began
// ("removal 1: new leader a after 37ms", then DEL = 0, in a loaded run);
// with the server paused 500 ms while a candidate's try was on its way,
// the new leader's lease ended "not renewed before its deadline" 6 ms into
// its term, and Run's Release deleted the lock. No safety was lost (fn's
// ctx was done from the start), but a term was started, and told to stop,
// for nothing. Run now releases such a lease and returns ErrNotAcquired
// wrapping the lease's Err, without calling fn.
func TestRunLeaseEndedBeforeFn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &lateLocker{Locker: newMemlock(t), late: 1}
		called := false
		err := fence.Run(t.Context(), l, "late", func(ctx context.Context, lease fence.Lease) error {
			called = true
			if lerr := lease.Err(); lerr != nil {
				t.Errorf("fn called with a lease that had already ended: %v", lerr)
			}
			return nil
		}, fence.TTL(time.Second))
		t.Logf("Run = %v", err)
		if called {
			t.Error("fn was called")
		}
		if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, fence.ErrLeaseLost) {
			t.Errorf("Run = %v, want ErrNotAcquired wrapping the lease's Err (ErrLeaseLost)", err)
		}
		if n := l.released.Load(); n != 1 {
			t.Errorf("the ended lease was released %d times, want 1", n)
		}
	})
}

// Lead given a lease that ended before Acquire returned starts no term:
// neither fn nor OnElected nor OnDeposed is called with it; it is
// released, and the candidate campaigns again after the pause that follows
// a lost lease (about the minimum back-off), then leads with a live lease.
func TestLeadLeaseEndedBeforeFn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &lateLocker{Locker: newMemlock(t), late: 2}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var elected, deposed, terms int
		const minBackoff = 200 * time.Millisecond
		err := fence.Lead(ctx, l, "late", func(ctx context.Context, lease fence.Lease) error {
			terms++
			if lerr := lease.Err(); lerr != nil {
				t.Errorf("term %d began with a lease that had already ended: %v", terms, lerr)
			}
			cancel() // one live term is enough
			<-ctx.Done()
			return nil
		}, fence.LeaseOptions(fence.TTL(time.Second)), fence.Backoff(minBackoff, 10*time.Second),
			fence.OnElected(func(fence.Lease) { elected++ }),
			fence.OnDeposed(func(fence.Lease, error) { deposed++ }))
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Lead = %v, want context.Canceled", err)
		}
		l.mu.Lock()
		calls, acquires := l.calls, l.acquires
		l.mu.Unlock()
		if len(acquires) != 3 || terms != 1 || elected != 1 || deposed != 1 {
			t.Fatalf("%d Acquires, %d terms, %d OnElected, %d OnDeposed; want 3, 1, 1, 1 (two leases returned ended begin no term)", len(acquires), terms, elected, deposed)
		}
		if n := l.released.Load(); n != 2 {
			t.Errorf("the ended leases were released %d times, want 2", n)
		}
		// The lost-lease pause, not a growing back-off: between half and
		// all of the minimum after each.
		for i := 1; i < len(acquires); i++ {
			if d := calls[i].Sub(acquires[i-1]); d < minBackoff/2 || d > minBackoff {
				t.Errorf("pause before campaign %d: %v, want %v to %v", i+1, d, minBackoff/2, minBackoff)
			}
		}
	})
}
