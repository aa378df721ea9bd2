// Package stresstest holds stress tests that fence's backends share: holders
// that Extend and Release at once, on one lock, with contexts cancelled at
// random moments.
package stresstest

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// ends records the ends reported to the Observer, by token.
type ends struct {
	fence.NopObserver
	mu     sync.Mutex
	causes map[fence.Token][]fence.LeaseCause
	more   chan struct{} // closed (and replaced) at each report
}

func (e *ends) LeaseEnded(ev fence.LeaseEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.causes[ev.Token] = append(e.causes[ev.Token], ev.Cause)
	close(e.more)
	e.more = make(chan struct{})
}

// of returns the causes reported for tk, once there is one or at until.
func (e *ends) of(tk fence.Token, until <-chan time.Time) []fence.LeaseCause {
	for {
		e.mu.Lock()
		causes, more := append([]fence.LeaseCause(nil), e.causes[tk]...), e.more
		e.mu.Unlock()
		if len(causes) > 0 {
			return causes
		}
		select {
		case <-more:
		case <-until:
			return nil
		}
	}
}

// RandomCancels runs 4 holders for d, each with a Locker of its own made by
// newLocker with obs as its Observer, on one lock: Acquire, Extend and
// Release (at once) with contexts cancelled at random moments (seeded; the
// seed is logged), or for Release one derived from the lease's Context,
// half of the leases fixed-TTL, half watchdog ones. It checks that a
// Release's context derived from the lease's is not cancelled by the
// lease's end as released,
// that there are never two holders at once (a grant while an
// earlier lease has no Err and is before its Deadline), that tokens
// strictly increase in the order granted, that a lease has ended once its
// Release has returned, and that each lease's end is reported exactly once,
// as Released when its first Release returned nil (Err then ErrReleased),
// and as a loss when it returned an error matching fence.ErrLeaseLost (Err
// matching it too).
func RandomCancels(t *testing.T, d time.Duration, newLocker func(t *testing.T, obs fence.Observer) fence.Locker) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	obs := &ends{causes: map[fence.Token][]fence.LeaseCause{}, more: make(chan struct{})}
	const name = "random-cancels"
	type outcome struct {
		lease fence.Lease
		first error // the first Release's result
	}
	var (
		mu       sync.Mutex
		live     []fence.Lease
		last     fence.Token
		outcomes []outcome
	)
	granted := func(ls fence.Lease) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		for _, o := range live {
			if o.Err() == nil && now.Before(o.Deadline()) {
				t.Errorf("token %d granted while token %d is held until %v", ls.Token(), o.Token(), o.Deadline())
			}
		}
		if ls.Token() <= last {
			t.Errorf("token %d granted after %d", ls.Token(), last)
		}
		last = ls.Token()
		live = append(live[:0], ls)
	}
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range 4 {
		r := rand.New(rand.NewPCG(seed, uint64(w)))
		l := newLocker(t, obs)
		wg.Go(func() {
			short := func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Duration(r.IntN(3000))*time.Microsecond)
			}
			for time.Now().Before(stop) {
				opts := []fence.Option{fence.Wait(300 * time.Millisecond)}
				if r.IntN(2) == 0 {
					opts = append(opts, fence.TTL(time.Duration(100+r.IntN(400))*time.Millisecond))
				}
				actx, acancel := short()
				if r.IntN(3) == 0 {
					actx, acancel = context.WithTimeout(context.Background(), time.Second)
				}
				ls, err := l.Acquire(actx, name, opts...)
				acancel()
				if err != nil {
					if !errors.Is(err, fence.ErrNotAcquired) {
						t.Errorf("Acquire = %v", err)
					}
					continue
				}
				granted(ls)
				var inner sync.WaitGroup
				ectx, ecancel := short()
				inner.Go(func() { _ = ls.Extend(ectx, 200*time.Millisecond) })
				rctx, rcancel := short()
				own := false // rctx ends with the lease
				switch r.IntN(4) {
				case 0:
					rcancel()
					rctx, rcancel = context.WithTimeout(context.Background(), time.Second)
				case 1:
					rcancel()
					rctx, rcancel = context.WithTimeout(ls.Context(), time.Second)
					own = true
				}
				dl := ls.Deadline()
				err = ls.Release(rctx)
				rcancel()
				// Cancelled by the lease's end as released (not lost
				// before: then the loss cancels it, as any ctx), before
				// the lease's deadline (at which it ends, as the lease's
				// expiry ended it before Release ended the lease first).
				if own && errors.Is(err, context.Canceled) && errors.Is(context.Cause(ls.Context()), fence.ErrReleased) && time.Now().Before(dl) {
					t.Errorf("token %d: Release with a context of the lease's = %v: the lease's end cancelled it", ls.Token(), err)
				}
				if ls.Err() == nil {
					t.Errorf("lease of token %d not ended after Release = %v", ls.Token(), err)
				}
				mu.Lock()
				outcomes = append(outcomes, outcome{ls, err})
				mu.Unlock()
				inner.Wait()
				ecancel()
				if err != nil && r.IntN(2) == 0 {
					rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
					_ = ls.Release(rctx)
					rcancel()
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d grants", len(outcomes))
	// Reported when Release returns, or, for a lease that ended
	// otherwise, when it did: all of them by now, or soon.
	until := time.After(5 * time.Second)
	for _, o := range outcomes {
		tk := o.lease.Token()
		causes := obs.of(tk, until)
		if len(causes) != 1 {
			t.Errorf("token %d (first Release = %v): ends reported %v, want one", tk, o.first, causes)
			continue
		}
		lerr := o.lease.Err()
		switch {
		case o.first == nil:
			if causes[0] != fence.Released || lerr != fence.ErrReleased {
				t.Errorf("token %d: Release = nil, but reported %v, Err = %v", tk, causes[0], lerr)
			}
		case errors.Is(o.first, fence.ErrLeaseLost):
			if causes[0] == fence.Released || !errors.Is(lerr, fence.ErrLeaseLost) {
				t.Errorf("token %d: Release = %v, but reported %v, Err = %v", tk, o.first, causes[0], lerr)
			}
		}
	}
}
