package fence_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// downLease is a lease whose backend went down during fn: every Release
// fails without a conclusion.
type downLease struct{ fence.Lease }

func (downLease) Release(context.Context) error { return errors.New("dial tcp: connection refused") }

type downAfterAcquire struct{ fence.Locker }

func (l downAfterAcquire) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	return downLease{lease}, nil
}

// House rule: a server that is down gets an error within the caller's
// deadline. Run retries an inconclusive Release for up to 5 s whatever
// ctx's deadline (documented), so a caller with 1 s left waits 5 s.
func TestRunReleaseRetryWithinCallersDeadline(t *testing.T) {
	t.Skip("design question: Run retries a Release that failed without a conclusion for releaseTimeout (5 s) on a context stripped of ctx's cancellation and deadline, so with the backend down Run returns 5 s after fn, past a 1 s ctx deadline (unskipped: 5 s). That is deliberate (a lock left held blocks others for its lease time) and documented. " +
		"The fix I would choose: the first Release try keeps its 5 s (a ctx ended by fn's work must still free the lock), retries stop at ctx's deadline when it has one; it trades a longer-held lock for the caller's bound, so it needs a decision")
	synctest.Test(t, func(t *testing.T) {
		m := newMemlock(t)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		err := fence.Run(ctx, downAfterAcquire{m}, "x", func(context.Context, fence.Lease) error { return nil })
		if err == nil {
			t.Fatal("Run = nil, want the Release error")
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("Run returned %v after it began, past ctx's 1 s deadline", took)
		}
	})
}
