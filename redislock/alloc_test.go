package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
)

func BenchmarkAcquireRelease(b *testing.B) {
	srv := redistest.Start(b)
	l := newLocker(b, srv.Client(b))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		lease, err := l.Acquire(ctx, "bench", fence.TTL(10*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireReleaseDeadline is BenchmarkAcquireRelease with a context
// that has a deadline, as most callers' have: every call then goes through
// bounded (a goroutine and a channel per call), which a context without one
// skips.
func BenchmarkAcquireReleaseDeadline(b *testing.B) {
	srv := redistest.Start(b)
	l := newLocker(b, srv.Client(b))
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		lease, err := l.Acquire(ctx, "bench", fence.TTL(10*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
