package fence_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// closingLocker is a Locker whose client the test closes: once closed,
// Acquire fails with an error matching fence.ErrClosed and a lease's
// Release says so too. With spurious, only Release says so: the Locker
// goes on granting (a Ring's shard client replaced under one call).
type closingLocker struct {
	fence.Locker
	closed    atomic.Bool
	spurious  bool
	campaigns atomic.Int64
}

func (l *closingLocker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	l.campaigns.Add(1)
	if l.closed.Load() && !l.spurious {
		return nil, fence.NotAcquired(name, fmt.Errorf("the client was closed: %w", fence.ErrClosed))
	}
	lease, err := l.Locker.Acquire(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	return closingLease{lease, l}, nil
}

type closingLease struct {
	fence.Lease
	l *closingLocker
}

func (ls closingLease) Release(ctx context.Context) error {
	err := ls.Lease.Release(ctx)
	if ls.l.closed.Load() {
		return fmt.Errorf("the client was closed: %w", fence.ErrClosed)
	}
	return err
}

// A term whose Release says the client was closed is followed by a
// campaign at once, which returns fence.ErrClosed: Lead returned one
// back-off later (7.6 s here, an early return's 5 to 10 s with
// Backoff(5s, 10s); 2.1 to 3.8 s on redislock, etcdlock, zklock and
// redlock with Backoff(3s, 5s)). So too when fn's error says closed as
// well: a leader whose fn takes locks of its own on the same Locker (one
// per item) finds it closed there too, and returns that error; Lead
// returned one back-off after the close (8.6 s here): it read Run's
// error, fn's joined with Release's, and set the whole of it aside.
func TestLeadStopsAtOnceAfterClosedTerm(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context, l *closingLocker) error
	}{
		{"fn returns nil", func(context.Context, *closingLocker) error { return nil }},
		{"fn and Release say closed", func(ctx context.Context, l *closingLocker) error {
			_, err := l.Acquire(ctx, "closed-term:item")
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := &closingLocker{Locker: newMemlock(t)}
				var closedAt time.Time
				err := fence.Lead(t.Context(), l, "closed-term", func(ctx context.Context, lease fence.Lease) error {
					l.closed.Store(true)
					closedAt = time.Now()
					return tc.fn(ctx, l)
				}, fence.Backoff(5*time.Second, 10*time.Second))
				if !errors.Is(err, fence.ErrClosed) {
					t.Fatalf("Lead = %v, want an error matching fence.ErrClosed", err)
				}
				if took := time.Since(closedAt); took > 0 {
					t.Errorf("Lead returned %v after the close, want at once (no back-off)", took)
				}
			})
		})
	}
}

// fn's own error matching fence.ErrClosed (another Locker of fn's, closed)
// says nothing of Lead's Locker: the term is an early return as any other,
// followed by the back-off.
func TestLeadBacksOffAfterFnClosedError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &closingLocker{Locker: newMemlock(t)}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var ended time.Time
		terms := 0
		err := fence.Lead(ctx, l, "fn-closed", func(ctx context.Context, lease fence.Lease) error {
			terms++
			if terms == 2 {
				if gap := time.Since(ended); gap < 2500*time.Millisecond {
					t.Errorf("the second term began %v after the first, want a back-off of at least 2.5 s", gap)
				}
				cancel()
				return nil
			}
			ended = time.Now()
			return fmt.Errorf("fn's other store: %w", fence.ErrClosed)
		}, fence.Backoff(5*time.Second, 10*time.Second))
		if !errors.Is(err, context.Canceled) || terms != 2 {
			t.Fatalf("Lead = %v after %d terms, want context.Canceled after 2", err, terms)
		}
	})
}

// A Locker whose Release says closed while it goes on granting (spurious)
// gets one campaign at once, not a loop of them: the term after it is
// paused as any other.
func TestLeadClosedTermNoHotLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &closingLocker{Locker: newMemlock(t), spurious: true}
		l.closed.Store(true)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		err := fence.Lead(ctx, l, "spurious", func(ctx context.Context, lease fence.Lease) error {
			if l.campaigns.Load() > 1000 {
				cancel() // a hot loop: virtual time would never pass
			}
			return nil
		}, fence.Backoff(time.Second, time.Second))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lead = %v, want context.DeadlineExceeded", err)
		}
		// A pause of 0.5 to 1 s after every other term: at most 2 terms
		// a pause, 10 s / 0.5 s pauses, and one more.
		if n := l.campaigns.Load(); n > 41 {
			t.Errorf("%d campaigns in 10 s with Backoff(1s, 1s), want at most 41", n)
		}
	})
}

// A Locker closed by its own Close under a leader (redlock's, etcdlock's:
// they release the leases they hold) ends the term as released, which
// says nothing of a closed Locker: Lead pauses as after any early return
// before the campaign that fails with fence.ErrClosed (redlock: Lead
// returned 6.6 s after Close with Backoff(5s, 10s), run with the Skip taken out).
func TestLeadStopsAtOnceAfterLockerClose(t *testing.T) {
	t.Skip("design question: the lease that Close released ends with fence.ErrReleased, as one that fn released itself before it returned; " +
		"Lead cannot tell the two apart, and campaigning at once after either would also drop the back-off of a fn that releases and returns every term. " +
		"Close would have to end its leases with an error matching fence.ErrReleased and fence.ErrClosed, which every backend compares with == in places")
	srv := redistest.Start(t)
	l, err := redlock.New([]redis.UniversalClient{srv.Client(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	elected := make(chan struct{})
	led := make(chan error, 1)
	go func() {
		led <- fence.Lead(t.Context(), l, "locker-closed", func(ctx context.Context, lease fence.Lease) error {
			close(elected)
			<-ctx.Done()
			return nil
		}, fence.Backoff(5*time.Second, 10*time.Second))
	}()
	select {
	case <-elected:
	case <-time.After(30 * time.Second):
		t.Fatal("not elected within 30 s")
	}
	if err := l.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	select {
	case err := <-led:
		t.Logf("Lead returned %v after Close: %v", time.Since(closed), err)
		if !errors.Is(err, fence.ErrClosed) {
			t.Errorf("Lead = %v, want an error matching fence.ErrClosed", err)
		}
		if took := time.Since(closed); took > 2*time.Second {
			t.Errorf("Lead returned %v after Close, want at once (no back-off)", took)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Lead still running 30 s after Close")
	}
}
