package etcdlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Acquire and release of a free lock, beside etcd's concurrency.Mutex on
// the same server: with one session for all iterations (the Mutex's usual
// use; no lease is granted per lock) and with a session per lock (a lease
// per lock, as etcdlock grants).
func BenchmarkUncontended(b *testing.B) {
	endpoints := shared.Endpoints()
	ctx := context.Background()
	b.Run("etcdlock", func(b *testing.B) {
		l := newLocker(b, endpoints, nil)
		for b.Loop() {
			lease, err := l.Acquire(ctx, "bench-uncontended")
			if err != nil {
				b.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Mutex-shared-session", func(b *testing.B) {
		s, err := concurrency.NewSession(newClient(b, endpoints, nil))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		m := concurrency.NewMutex(s, "bench-mutex-shared")
		for b.Loop() {
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Mutex-session-per-lock", func(b *testing.B) {
		c := newClient(b, endpoints, nil)
		for b.Loop() {
			s, err := concurrency.NewSession(c)
			if err != nil {
				b.Fatal(err)
			}
			m := concurrency.NewMutex(s, "bench-mutex-per-lock")
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := s.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Handoffs between 8 goroutines on one lock, each on its own client.
func BenchmarkContended(b *testing.B) {
	endpoints := shared.Endpoints()
	ctx := context.Background()
	b.Run("etcdlock", func(b *testing.B) {
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			l := newLocker(b, endpoints, nil)
			for pb.Next() {
				lease, err := l.Acquire(ctx, "bench-contended", fence.Wait(time.Minute))
				if err != nil {
					b.Error(err)
					return
				}
				if err := lease.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("Mutex-session-per-goroutine", func(b *testing.B) {
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			s, err := concurrency.NewSession(newClient(b, endpoints, nil))
			if err != nil {
				b.Error(err)
				return
			}
			defer s.Close()
			m := concurrency.NewMutex(s, "bench-mutex-contended")
			for pb.Next() {
				if err := m.Lock(ctx); err != nil {
					b.Error(err)
					return
				}
				if err := m.Unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
