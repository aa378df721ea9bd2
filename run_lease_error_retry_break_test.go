package fence_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// flakyReleaseLease fails its first Release inconclusively (the statement
// went out on a connection a server restart had killed), as Run's own
// Release retry expects of a backend.
type flakyReleaseLease struct {
	fence.Lease
	calls atomic.Int64
}

func (l *flakyReleaseLease) Release(ctx context.Context) error {
	if l.calls.Add(1) == 1 {
		return errors.New("backend: connection reset by peer")
	}
	return l.Lease.Release(ctx)
}

type flakyLeaseAndErrorLocker struct{ fence.Locker }

func (l flakyLeaseAndErrorLocker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	return &flakyReleaseLease{Lease: lease}, errors.New("backend: reply garbled")
}

// TestRunReleasesLeaseReturnedWithErrorDespiteFlakyRelease: Run releases
// a lease a Locker returned together with an error; an inconclusive
// failure of that Release is retried, as Run retries the Release of a
// lease it ran fn under, rather than left holding the lock (its watchdog
// renewing it) with nobody to release it.
func TestRunReleasesLeaseReturnedWithErrorDespiteFlakyRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMemlock(t) // watchdog TTL 1 s
		err := fence.Run(t.Context(), flakyLeaseAndErrorLocker{m}, "x", func(context.Context, fence.Lease) error {
			t.Error("fn called with an Acquire error")
			return nil
		})
		if err == nil {
			t.Fatal("Run = nil, want Acquire's error")
		}
		time.Sleep(time.Minute) // synctest: fake time
		lease, err := m.Acquire(t.Context(), "x")
		if err != nil {
			t.Fatalf("the lease returned with an error, its first Release failed, still holds the lock a minute later: %v", err)
		}
		_ = lease.Release(t.Context())
	})
}
