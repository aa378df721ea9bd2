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
// deadline. Run retried an inconclusive Release for up to 5 s whatever
// ctx's deadline, so a caller with 1 s left waited 5 s; the retries now
// stop at ctx's deadline (decided: the lock then expires at the lease's
// deadline, as after any Release that failed).
func TestRunReleaseRetryWithinCallersDeadline(t *testing.T) {
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

// flakyLease fails its first n Releases without a conclusion.
type flakyLease struct {
	fence.Lease
	fails *int
}

func (l flakyLease) Release(ctx context.Context) error {
	if *l.fails > 0 {
		*l.fails--
		return errors.New("dial tcp: connection refused")
	}
	return l.Lease.Release(ctx)
}

type flakyAfterAcquire struct {
	fence.Locker
	fails *int
}

func (l flakyAfterAcquire) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	return flakyLease{lease, l.fails}, nil
}

// Within ctx's deadline, or with ctx cancelled (no deadline: the 5 s bound
// alone), an inconclusive Release is still retried until it frees the lock.
func TestRunReleaseRetriedBeforeCallersDeadline(t *testing.T) {
	for _, c := range []struct {
		name string
		ctx  func(context.Context) (context.Context, context.CancelFunc)
	}{
		{"deadline", func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, time.Minute)
		}},
		{"cancelled", context.WithCancel},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := newMemlock(t)
				ctx, cancel := c.ctx(t.Context())
				defer cancel()
				fails := 3
				err := fence.Run(ctx, flakyAfterAcquire{m, &fails}, "x", func(context.Context, fence.Lease) error {
					cancel() // the caller gave up during fn: the release must still go out
					return nil
				})
				if err != nil || fails != 0 {
					t.Fatalf("Run = %v with %d failures left, want nil after the retries", err, fails)
				}
				next, err := m.Acquire(t.Context(), "x", fence.Wait(0))
				if err != nil {
					t.Fatalf("the lock is not free after Run: %v", err)
				}
				_ = next.Release(t.Context())
			})
		})
	}
}
