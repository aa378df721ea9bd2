package redislock

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// BenchmarkObserveEvents is the observing itself, without Redis: what one
// acquisition and the end of its lease cost with a no-op Observer.
func BenchmarkObserveEvents(b *testing.B) {
	l := &Locker{obs: fence.NopObserver{}}
	ls := &lease{locker: l, attempt: attempt{name: "bench"}, token: 7, granted: time.Now(), ctx: context.Background()}
	b.ReportAllocs()
	for b.Loop() {
		fence.ReportAcquire(l.obs, backend, "bench", time.Now(), ls, nil)
		l.leaseEnded(ls, fence.Released, fence.ErrReleased)
	}
}
