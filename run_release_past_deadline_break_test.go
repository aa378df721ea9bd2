package fence_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// A ctx whose deadline passed while fn ran: Run's first Release is still
// made (the lock is free at once), and a failed one is not retried.
func TestRunReleaseAfterCtxDeadlinePassed(t *testing.T) {
	for _, fails := range []int{0, 1} {
		t.Run(map[int]string{0: "freed", 1: "failed-once"}[fails], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m := newMemlock(t)
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				defer cancel()
				n := fails
				var returned time.Time
				err := fence.Run(ctx, flakyAfterAcquire{m, &n}, "x", func(fctx context.Context, _ fence.Lease) error {
					<-fctx.Done()
					<-ctx.Done()
					returned = time.Now()
					return nil
				}, fence.TTL(time.Minute))
				if took := time.Since(returned); took > 0 {
					t.Errorf("Run returned %v after fn, past ctx's deadline", took)
				}
				_, aerr := m.Acquire(t.Context(), "x")
				switch fails {
				case 0:
					if err != nil || aerr != nil {
						t.Fatalf("Run = %v, next Acquire = %v; want the lock freed by the first try past the deadline", err, aerr)
					}
				default:
					if err == nil || n != 0 || !errors.Is(aerr, fence.ErrHeld) {
						t.Fatalf("Run = %v (%d failures left), next Acquire = %v; want the failed Release's error, no retry, the lock held to its lease's end", err, n, aerr)
					}
				}
			})
		})
	}
}

// stuckLease's Release blocks until its ctx ends (a backend that hangs).
type stuckLease struct{ fence.Lease }

func (stuckLease) Release(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }

type stuckAfterAcquire struct{ fence.Locker }

func (l stuckAfterAcquire) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	return stuckLease{lease}, nil
}

// A Release that hangs: the first try is made past ctx's deadline, on its
// own 5 s bound (releaseTimeout), and no retry follows. Run returns with
// its error 5 s after fn, not later: the decided cost of the first try.
func TestRunHungReleaseBoundedPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMemlock(t)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		var returned time.Time
		err := fence.Run(ctx, stuckAfterAcquire{m}, "x", func(fctx context.Context, _ fence.Lease) error {
			<-fctx.Done()
			returned = time.Now()
			return nil
		})
		took := time.Since(returned)
		if !errors.Is(err, context.DeadlineExceeded) || took != 5*time.Second {
			t.Fatalf("Run = %v, %v after fn; want the hung Release's deadline error after 5 s", err, took)
		}
	})
}

// Lead with the backend down during the term returns at ctx's deadline,
// with ctx's cause, not after 5 s of Release retries.
func TestLeadBackendDownReturnsByDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMemlock(t)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		err := fence.Lead(ctx, downAfterAcquire{m}, "x", func(ctx context.Context, _ fence.Lease) error {
			<-ctx.Done()
			return nil
		})
		if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > time.Second {
			t.Fatalf("Lead = %v after %v; want ctx's deadline error by 1 s", err, took)
		}
	})
}
