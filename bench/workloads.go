package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// latencies returns the p50 and p99 of ds.
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)*99/100]
}

// uncontended: n acquire+release pairs in a row on one key.
func uncontended(l *lib, n int) (p50, p99 time.Duration, err error) {
	ctx := context.Background()
	key := "bench:uncontended:" + l.name
	for range n / 10 { // warm up: connections, script cache
		release, err := l.acquire(ctx, key)
		if err != nil {
			return 0, 0, err
		}
		release()
	}
	ds := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		release, err := l.acquire(ctx, key)
		if err != nil {
			return 0, 0, err
		}
		release()
		ds = append(ds, time.Since(start))
	}
	p50, p99 = percentiles(ds)
	return p50, p99, nil
}

// contendedResult is what 32 goroutines on one key achieved.
type contendedResult struct {
	acquisitions  int
	holderChanges int
	seconds       float64
	p99Handoff    time.Duration
}

// contended: g goroutines take the same key for d, with no work inside. A
// holder change is an acquisition by a different goroutine than the last
// one; its handoff latency runs from the moment the previous holder began
// to release.
func contended(l *lib, g int, d time.Duration) (contendedResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	key := "bench:contended:" + l.name
	var mu sync.Mutex
	last, lastRelease := -1, time.Time{}
	var res contendedResult
	var handoffs []time.Duration
	var firstErr atomic.Value
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := range g {
		wg.Go(func() {
			for time.Now().Before(stop) {
				release, err := l.acquire(ctx, key)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				now := time.Now()
				mu.Lock()
				res.acquisitions++
				if last != i {
					res.holderChanges++
					if !lastRelease.IsZero() {
						handoffs = append(handoffs, now.Sub(lastRelease))
					}
				}
				last, lastRelease = i, time.Now()
				mu.Unlock()
				release()
			}
		})
	}
	start := time.Now()
	wg.Wait()
	res.seconds = time.Since(start).Seconds()
	if err, _ := firstErr.Load().(error); err != nil {
		return res, err
	}
	_, res.p99Handoff = percentiles(handoffs)
	return res, nil
}

// distinct: g goroutines, each on its own key, for d; acquire+release pairs
// per second.
func distinct(l *lib, g int, d time.Duration) (float64, error) {
	ctx := context.Background()
	var ops atomic.Int64
	var firstErr atomic.Value
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range g {
		wg.Go(func() {
			key := fmt.Sprintf("bench:distinct:%s:%d", l.name, i)
			for time.Now().Before(stop) {
				release, err := l.acquire(ctx, key)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				release()
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return float64(ops.Load()) / time.Since(start).Seconds(), nil
}

// allocs: heap allocations per acquire+release, over n in a row.
func allocs(l *lib, n int) (float64, error) {
	ctx := context.Background()
	key := "bench:allocs:" + l.name
	run := func() error {
		release, err := l.acquire(ctx, key)
		if err != nil {
			return err
		}
		release()
		return nil
	}
	for range 100 {
		if err := run(); err != nil {
			return 0, err
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		if err := run(); err != nil {
			return 0, err
		}
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(n), nil
}
