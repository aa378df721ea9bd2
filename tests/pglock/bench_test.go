package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// BenchmarkAcquireRelease is the uncontended path: one Acquire (a fixed
// TTL, so no watchdog) and its Release, one goroutine, a real PostgreSQL.
func BenchmarkAcquireRelease(b *testing.B) {
	d := newDatabase(b, pg)
	l := d.locker(b, d.db)
	ctx := context.Background()
	lease, err := l.Acquire(ctx, "bench", fence.TTL(time.Minute)) // the row exists
	if err != nil {
		b.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		lease, err := l.Acquire(ctx, "bench", fence.TTL(time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
