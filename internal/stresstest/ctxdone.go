package stresstest

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// RunCtxDoneWithLease checks, for each way a lease can end by itself (its
// fixed lease time running out; and, if remove is not nil, its lock
// deleted behind its back by remove), that fence.Run's fn finds its context
// done as soon as the lease's Done is closed (runs times), and as soon as
// its Err is not nil (runs/2 times), seen from another goroutine than the
// one that ended it: Run documents that a fn that checks ctx.Err() before
// each write never finds it nil once this process has seen the lease end.
func RunCtxDoneWithLease(t *testing.T, l fence.Locker, runs int, remove func(t testing.TB, name string)) {
	t.Helper()
	type way struct {
		what string
		opts []fence.Option
		end  func(name string)
	}
	ways := []way{{"lease time ran out", []fence.Option{fence.TTL(30 * time.Millisecond)}, func(string) {}}}
	if remove != nil {
		ways = append(ways, way{"lock removed", nil, func(name string) { remove(t, name) }})
	}
	seen := []struct {
		how  string
		runs int
		wait func(fence.Lease)
	}{
		{"Done was closed", runs, func(lease fence.Lease) { <-lease.Done() }},
		{"Err was not nil", runs / 2, func(lease fence.Lease) {
			for lease.Err() == nil {
				runtime.Gosched()
			}
		}},
	}
	for _, w := range ways {
		for _, s := range seen {
			late := 0
			for i := range s.runs {
				name := "ctx-done"
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				var ended sync.WaitGroup
				err := fence.Run(ctx, l, name, func(ctx context.Context, lease fence.Lease) error {
					// From another goroutine, as a watch or a timer would: a
					// synchronous end would be over before the lease is
					// looked at.
					ended.Go(func() { w.end(name) })
					s.wait(lease)
					if ctx.Err() == nil {
						late++
					}
					<-ctx.Done()
					return nil
				}, append(w.opts, fence.Wait(10*time.Second))...)
				cancel()
				ended.Wait()
				if !errors.Is(err, fence.ErrLeaseLost) {
					t.Fatalf("%s, run %d: Run = %v, want ErrLeaseLost", w.what, i, err)
				}
			}
			if late > 0 {
				t.Errorf("%s: in %d of %d runs fn's ctx was not done once the lease's %s", w.what, late, s.runs, s.how)
			}
		}
	}
}
