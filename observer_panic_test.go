package fence_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// panicOnAcquired is an Observer whose AcquireDone panics (a metric's nil
// map, say) for the first granted lease.
type panicOnAcquired struct {
	fence.NopObserver
	done atomic.Bool
}

func (p *panicOnAcquired) AcquireDone(ev fence.AcquireEvent) {
	if ev.Result == fence.Acquired && !p.done.Swap(true) {
		panic("observer bug")
	}
}

// An Observer whose AcquireDone panics makes Acquire panic after the lock
// was taken: nobody has the lease to release. A caller that recovers (an
// HTTP server, Run's caller, a supervisor around Lead) must not be left
// with a lock that the watchdog renews for ever, which no one could take
// again (as a panic in Run's fn, fixed in 6502d4c).
func TestObserverPanicInAcquireDoneFreesTheLock(t *testing.T) {
	for _, how := range []string{"Acquire", "Run", "Lead"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				obs, err := memlock.New(&memlock.Options{WatchdogTTL: time.Second, Observer: &panicOnAcquired{}})
				if err != nil {
					t.Fatal(err)
				}
				recovered := make(chan any, 1)
				go func() {
					defer func() { recovered <- recover() }()
					fn := func(context.Context, fence.Lease) error { t.Error("fn ran"); return nil }
					switch how {
					case "Acquire":
						_, _ = obs.Acquire(t.Context(), "n")
					case "Run":
						_ = fence.Run(t.Context(), obs, "n", fn)
					case "Lead":
						_ = fence.Lead(t.Context(), obs, "n", fn)
					}
				}()
				if r := <-recovered; r != "observer bug" {
					t.Fatalf("recovered %v, want the Observer's panic", r)
				}
				// Another caller waits ten watchdog TTLs.
				lease, err := obs.Acquire(t.Context(), "n", fence.Wait(10*time.Second))
				if err != nil {
					t.Fatalf("the lock taken by the Acquire whose Observer panicked is still held: %v", err)
				}
				_ = lease.Release(t.Context())
			})
		})
	}
}
