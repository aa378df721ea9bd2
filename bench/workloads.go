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

// latency is one library's uncontended p50 and p99.
type latency struct {
	p50, p99 time.Duration
	scriptUS float64 // µs in scripts per pair, the median turn's (0 without a scriptClock)
}

// batch is how many pairs in a row uncontended times of one library before
// it passes to the next.
const batch = 50

// uncontended: n acquire+release pairs of each library on its own key, one
// at a time, the libraries taking turns every batch pairs (starting with
// library round, so that none always goes first). With scripts, each turn
// also reads the server's time in scripts before and after it.
func uncontended(ls []*lib, n, round int, scripts scriptClock) ([]latency, error) {
	ctx := context.Background()
	key := func(l *lib) string { return "bench:uncontended:" + l.name }
	pair := func(l *lib) (time.Duration, error) {
		start := time.Now()
		release, err := l.acquire(ctx, key(l))
		if err != nil {
			return 0, fmt.Errorf("%s uncontended: %w", l.name, err)
		}
		release()
		return time.Since(start), nil
	}
	for _, l := range ls {
		for range n / 10 { // warm up: connections, script cache
			if _, err := pair(l); err != nil {
				return nil, err
			}
		}
	}
	ds := make([][]time.Duration, len(ls))
	inScripts := make([][]float64, len(ls)) // µs per pair, a turn each
	for done := 0; done < n; done += batch {
		for k := range ls {
			i := (k + round) % len(ls)
			var before float64
			if scripts != nil {
				var err error
				if before, err = scripts(); err != nil {
					return nil, err
				}
			}
			m := min(batch, n-done)
			for range m {
				d, err := pair(ls[i])
				if err != nil {
					return nil, err
				}
				ds[i] = append(ds[i], d)
			}
			if scripts != nil {
				after, err := scripts()
				if err != nil {
					return nil, err
				}
				inScripts[i] = append(inScripts[i], (after-before)/float64(m))
			}
		}
	}
	out := make([]latency, len(ls))
	for i := range ls {
		out[i].p50, out[i].p99 = percentiles(ds[i])
		if len(inScripts[i]) > 0 {
			slices.Sort(inScripts[i])
			out[i].scriptUS = inScripts[i][len(inScripts[i])/2]
		}
	}
	return out, nil
}

// contendedResult is what 32 goroutines on one key achieved.
type contendedResult struct {
	acquisitions  int
	holderChanges int
	seconds       float64
	p99Handoff    time.Duration
	handoffs      []time.Duration // every handoff, in order
	// p99Release is the p99 of the release calls: one round trip for most
	// libraries, and for fence the one that hands the lock on, so that a
	// handoff can be no shorter.
	p99Release time.Duration
	// cmdsSlack bounds the error of contendedWindow's cmdsPerAcq: at each
	// cut, up to one acquisition per goroutine is in flight, its commands
	// counted on one side of the cut and the acquisition on the other.
	cmdsSlack float64
}

// contended: g goroutines take the same key for d, with no work inside. A
// holder change is an acquisition by a different goroutine than the last
// one; its handoff latency runs from the moment the previous holder began
// to release.
func contended(l *lib, g int, d time.Duration) (contendedResult, error) {
	res, _, err := contendedWindow(l, g, 0, d, nil)
	return res, err
}

// contendedWindow is contended run for warm+d, with count (the commands a
// proxy has seen) read at warm and at warm+d, in the middle of the
// workload: cmdsPerAcq is the commands sent between those two moments over
// the acquisitions made between them. Both ends cut a running workload, so
// what a library does once (connect, subscribe, its first waiters' tries)
// and what is in flight at either cut weigh alike on every library; the
// result, res, covers the whole run.
func contendedWindow(l *lib, g int, warm, d time.Duration, count func() int64) (res contendedResult, cmdsPerAcq float64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), warm+d+30*time.Second)
	defer cancel()
	key := "bench:contended:" + l.name
	var mu sync.Mutex
	last, lastRelease := -1, time.Time{}
	var handoffs, releases []time.Duration
	var firstErr atomic.Value
	begin := time.Now()
	stop := begin.Add(warm + d)
	var wg sync.WaitGroup
	var marks sync.WaitGroup
	var acqs [2]int
	var cmds [2]int64
	if count != nil {
		for i, at := range []time.Duration{warm, warm + d} {
			marks.Go(func() {
				time.Sleep(time.Until(begin.Add(at)))
				mu.Lock()
				acqs[i], cmds[i] = res.acquisitions, count()
				mu.Unlock()
			})
		}
	}
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
				began := lastRelease
				mu.Unlock()
				release()
				took := time.Since(began)
				mu.Lock()
				releases = append(releases, took)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	marks.Wait()
	res.seconds = time.Since(begin).Seconds()
	cmdsPerAcq = float64(cmds[1]-cmds[0]) / float64(max(acqs[1]-acqs[0], 1))
	res.cmdsSlack = float64(g) * cmdsPerAcq / float64(max(acqs[1]-acqs[0], 1))
	if err, _ := firstErr.Load().(error); err != nil {
		return res, cmdsPerAcq, err
	}
	res.handoffs = slices.Clone(handoffs)
	_, res.p99Handoff = percentiles(handoffs)
	_, res.p99Release = percentiles(releases)
	return res, cmdsPerAcq, nil
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
