package fence_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// refusingLateLocker refuses its first `late` Acquires as the module's
// backends now refuse a take answered past the lease's deadline: the lock
// given back, ErrNotAcquired saying the reply came too late, matching
// ErrLeaseLost (redislock's wording; each backend has its own unexported
// errLateReply).
type refusingLateLocker struct {
	fence.Locker
	late     int
	mu       sync.Mutex
	calls    []time.Time
	acquires []time.Time
}

func (l *refusingLateLocker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	l.mu.Lock()
	l.calls = append(l.calls, time.Now())
	n := len(l.acquires)
	l.mu.Unlock()
	var lease fence.Lease
	var err error
	if n < l.late {
		time.Sleep(time.Second) // the bubble's clock: the lease time, on its way
		err = fence.NotAcquired(name, fmt.Errorf("%w: redislock: the reply that took the lock came too late: 1s after the try was sent, past the lease's deadline (lease time 1s); given back", fence.ErrLeaseLost))
	} else {
		lease, err = l.Locker.Acquire(ctx, name, opts...)
	}
	l.mu.Lock()
	l.acquires = append(l.acquires, time.Now())
	l.mu.Unlock()
	return lease, err
}

// TestLeadLateTakeRefusedPause: 54a5914 made Lead campaign again after the
// lost-lease pause, not a growing back-off, when Acquire returned a lease
// already ended (a take answered past its deadline). The backends then
// came to refuse such a take themselves (ErrNotAcquired, too late), and
// Lead, seeing a failed Acquire, backed off as after an outage: 369 ms,
// 652 ms, 1.31 s after three refusals ('want 100ms to 200ms'). Their
// error matches ErrLeaseLost, and Lead takes it as a lost lease.
func TestLeadLateTakeRefusedPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &refusingLateLocker{Locker: newMemlock(t), late: 3}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		const minBackoff = 200 * time.Millisecond
		err := fence.Lead(ctx, l, "late", func(ctx context.Context, lease fence.Lease) error {
			cancel()
			<-ctx.Done()
			return nil
		}, fence.LeaseOptions(fence.TTL(time.Second)), fence.Backoff(minBackoff, 10*time.Second))
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Lead = %v, want context.Canceled", err)
		}
		l.mu.Lock()
		calls, acquires := l.calls, l.acquires
		l.mu.Unlock()
		if len(acquires) != 4 {
			t.Fatalf("%d Acquires, want 4", len(acquires))
		}
		for i := 1; i < len(acquires); i++ {
			if d := calls[i].Sub(acquires[i-1]); d < minBackoff/2 || d > minBackoff {
				t.Errorf("pause before campaign %d: %v, want %v to %v", i+1, d, minBackoff/2, minBackoff)
			}
		}
	})
}
