package fence_test

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// countingLocker counts the Acquires made through it; after limit of them
// it cancels stop, so that a candidate that spins without blocking ends the
// test instead of hanging it.
type countingLocker struct {
	fence.Locker
	n     atomic.Int64
	limit int64
	stop  context.CancelFunc
}

func (c *countingLocker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	if c.n.Add(1) == c.limit {
		c.stop()
	}
	if c.Locker == nil {
		return nil, fence.NotAcquired(name, errors.New("backend down"))
	}
	return c.Locker.Acquire(ctx, name, opts...)
}

// A panic in fn (or in OnElected) goes up through Lead, as a panic in a
// goroutine would; but the lease is released first: a caller that recovers
// (an HTTP server, a supervisor) must not be left with a lock that its
// watchdog renews for ever, and no other candidate could ever take.
func TestLeadPanicInFnReleasesTheLock(t *testing.T) {
	for _, where := range []string{"fn", "OnElected"} {
		t.Run(where, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := newMemlock(t) // watchdog TTL 1 s
				fn := func(context.Context, fence.Lease) error {
					if where == "fn" {
						panic("boom")
					}
					return nil
				}
				elected := func(fence.Lease) {
					if where == "OnElected" {
						panic("boom")
					}
				}
				recovered := make(chan any, 1)
				go func() {
					defer func() { recovered <- recover() }()
					_ = fence.Lead(t.Context(), l, "leader", fn, fence.OnElected(elected))
				}()
				if r := <-recovered; r != "boom" {
					t.Fatalf("recovered %v, want fn's panic", r)
				}
				lease, err := l.Acquire(t.Context(), "leader", fence.Wait(5*time.Second))
				if err != nil {
					t.Fatalf("the panicking leader's lock is still held: %v", err)
				}
				_ = lease.Release(t.Context())
			})
		})
	}
}

// A Locker that answers "held" at once (a tiny Wait budget, or a backend
// that tries once whatever the budget) must not make Lead campaign in a hot
// loop against the backend: at most one campaign per minimum back-off.
func TestLeadHeldAtOnceDoesNotSpin(t *testing.T) {
	for _, wait := range []time.Duration{time.Nanosecond, time.Microsecond, time.Millisecond} {
		t.Run(wait.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := newMemlock(t)
				holder, err := l.Acquire(t.Context(), "leader")
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				c := &countingLocker{Locker: l, limit: 10000, stop: cancel}
				start := time.Now()
				_ = fence.Lead(ctx, c, "leader", func(context.Context, fence.Lease) error { return nil },
					fence.LeaseOptions(fence.Wait(wait)), fence.Backoff(100*time.Millisecond, time.Second))
				elapsed := time.Since(start)
				if max := int64(elapsed/(50*time.Millisecond)) + 1; c.n.Load() > max {
					t.Fatalf("%d campaigns in %v with Wait %v: a hot loop (want at most %d)", c.n.Load(), elapsed, wait, max)
				}
				_ = holder.Release(t.Context())
			})
		})
	}
}

// A backend that fails forever is retried with the growing back-off, not in
// a loop.
func TestLeadBackendDownBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		c := &countingLocker{limit: 10000, stop: cancel}
		err := fence.Lead(ctx, c, "leader", func(context.Context, fence.Lease) error { t.Error("fn ran"); return nil },
			fence.Backoff(100*time.Millisecond, 10*time.Second))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lead = %v, want the deadline", err)
		}
		// 0.1+0.2+...+6.4 s then 10 s each: at most about 14 in a minute.
		if n := c.n.Load(); n > 20 || n < 6 {
			t.Fatalf("%d campaigns in a minute against a dead backend", n)
		}
	})
}

// Lead returns with ctx's cause as soon as ctx ends, whether it is waiting
// in Acquire for a lock another holds, or pausing in a long back-off after
// fn failed; and when it returns, fn has returned and the lock is free.
func TestLeadReturnsWhenCtxEnds(t *testing.T) {
	for _, where := range []string{"campaigning", "backing off", "leading"} {
		t.Run(where, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := newMemlock(t)
				if where == "campaigning" {
					holder, err := l.Acquire(t.Context(), "leader")
					if err != nil {
						t.Fatal(err)
					}
					defer holder.Release(t.Context())
				}
				why := errors.New("shutdown")
				ctx, cancel := context.WithCancelCause(t.Context())
				done := make(chan error, 1)
				go func() {
					done <- fence.Lead(ctx, l, "leader", func(ctx context.Context, _ fence.Lease) error {
						if where == "backing off" {
							return errors.New("fn failed")
						}
						<-ctx.Done()
						return nil
					}, fence.Backoff(time.Hour, time.Hour), fence.LeaseOptions(fence.Wait(time.Hour)))
				}()
				time.Sleep(time.Second)
				synctest.Wait()
				cancelled := time.Now()
				cancel(why)
				if err := <-done; err != why {
					t.Fatalf("Lead = %v, want ctx's cause", err)
				}
				if took := time.Since(cancelled); took != 0 {
					t.Fatalf("Lead returned %v after ctx ended", took)
				}
				if where != "campaigning" {
					lease, err := l.Acquire(t.Context(), "leader")
					if err != nil {
						t.Fatalf("the lock is held after Lead returned: %v", err)
					}
					_ = lease.Release(t.Context())
				}
			})
		})
	}
}

// A nil fn or Locker is bad input, reported at once, before any lock is
// taken (it used to take the lock and panic with it held).
func TestLeadAndRunNilInput(t *testing.T) {
	l := newMemlock(t)
	fn := func(context.Context, fence.Lease) error { return nil }
	for what, err := range map[string]error{
		"Lead nil fn":     fence.Lead(t.Context(), l, "x", nil),
		"Lead nil Locker": fence.Lead(t.Context(), nil, "x", fn),
		"Run nil fn":      fence.Run(t.Context(), l, "x", nil),
		"Run nil Locker":  fence.Run(t.Context(), nil, "x", fn),
	} {
		if !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("%s = %v, want ErrInvalidOption", what, err)
		}
	}
	lease, err := l.Acquire(t.Context(), "x")
	if err != nil {
		t.Fatalf("the lock was left held: %v", err)
	}
	_ = lease.Release(t.Context())
}

// Back-off bounds with no real cap (max = the largest Duration) do not
// overflow after many failures in a row: no panic, no zero pause.
func TestLeadBackoffNoCapDoesNotOverflow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		c := &countingLocker{limit: 70, stop: cancel}
		start := time.Now()
		_ = fence.Lead(ctx, c, "leader", func(context.Context, fence.Lease) error { return nil },
			fence.Backoff(time.Millisecond, time.Duration(math.MaxInt64)))
		if c.n.Load() != 70 {
			t.Fatalf("%d campaigns", c.n.Load())
		}
		if took := time.Since(start); took < 1<<40*time.Millisecond {
			t.Fatalf("70 failures in a row took only %v: the back-off stopped growing", took)
		}
	})
}

// A fn that ignores its context keeps Lead from returning after ctx ends,
// and its watchdog lease held (it may still be writing), until it returns;
// then Lead returns at once and the lock is free.
func TestLeadWaitsForFnThatIgnoresCtx(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		ctx, cancel := context.WithCancel(t.Context())
		let := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- fence.Lead(ctx, l, "leader", func(context.Context, fence.Lease) error { <-let; return nil })
		}()
		synctest.Wait()
		cancel()
		time.Sleep(time.Minute)
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("Lead returned %v while fn still ran", err)
		default:
		}
		if _, err := l.Acquire(t.Context(), "leader"); !errors.Is(err, fence.ErrHeld) {
			t.Fatalf("Acquire while the stubborn fn runs = %v, want ErrHeld", err)
		}
		close(let)
		<-done
		lease, err := l.Acquire(t.Context(), "leader")
		if err != nil {
			t.Fatalf("the lock is held after Lead returned: %v", err)
		}
		_ = lease.Release(t.Context())
	})
}
