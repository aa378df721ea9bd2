package pglock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/stresstest"
	"github.com/fencekit/fence/pglock"
)

// Holders that Extend and Release at once, with contexts cancelled at
// random moments (seeded; the seed is logged), on one lock: never two
// holders at once (a new grant while an earlier lease is neither ended nor
// past its Deadline), tokens strictly increasing in the order granted, and
// every lease ended once its Release has returned.
func TestRandomCancelsNeverTwoHolders(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	d := newDatabase(t, pg)
	const name = "random-cancels"
	var (
		mu     sync.Mutex
		live   []fence.Lease
		last   fence.Token
		grants int
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
		grants++
		live = append(live[:0], ls)
	}
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for w := range 4 {
		r := rand.New(rand.NewPCG(seed, uint64(w)))
		l := d.locker(t, d.db)
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
				t0 := time.Now()
				ls, err := l.Acquire(actx, name, opts...)
				acancel()
				if err != nil && time.Since(t0) > 100*time.Millisecond {
					var owner string
					var left float64
					_ = d.db.QueryRow(`SELECT owner, extract(epoch FROM expires_at - clock_timestamp()) FROM fence_leases WHERE name = $1`, name).Scan(&owner, &left)
					t.Logf("w%d Acquire after %v = %v; row owner %q left %.3fs", w, time.Since(t0), err, owner, left)
				}
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
				if r.IntN(2) == 0 {
					rcancel()
					rctx, rcancel = context.WithTimeout(context.Background(), time.Second)
				}
				err = ls.Release(rctx)
				rcancel()
				if ls.Err() == nil {
					t.Errorf("lease of token %d not ended after Release = %v", ls.Token(), err)
				}
				inner.Wait()
				ecancel()
				if r.IntN(2) == 0 && err != nil {
					rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
					_ = ls.Release(rctx)
					rcancel()
				}
			}
		})
	}
	wg.Wait()
	// Few under load: most Acquires have a context of a few milliseconds,
	// and a Release that fails leaves the row to expire.
	t.Logf("%d grants", grants)
}

// TestRandomCancelsReported is TestRandomCancelsNeverTwoHolders through
// stresstest.RandomCancels, which also gives some Releases a context of the
// lease's and checks the ends reported to an Observer (see there).
func TestRandomCancelsReported(t *testing.T) {
	d := newDatabase(t, pg)
	stresstest.RandomCancels(t, 3*time.Second, func(t *testing.T, obs fence.Observer) fence.Locker {
		return d.lockerWith(t, d.db, pglock.Options{Observer: obs})
	})
}
