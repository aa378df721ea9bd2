package fenceprom_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fenceprom"
	"github.com/fencekit/fence/memlock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsAfterPanicCancelAndRelease drives memlock with the adapter
// through the paths where a count could lie: fn panics under fence.Run (the
// lease must count as released, not lost, nor stay unended), an Acquire
// cancelled while waiting (cancelled, no lease), and one that finds the lock
// held with no budget (held).
func TestMetricsAfterPanicCancelAndRelease(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := fenceprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	locker, err := memlock.New(&memlock.Options{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want boom", p)
			}
		}()
		_ = fence.Run(ctx, locker, "job", func(context.Context, fence.Lease) error { panic("boom") })
	}()

	holder, err := locker.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locker.Acquire(ctx, "job"); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("second Acquire: %v, want ErrHeld", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := locker.Acquire(cctx, "job", fence.Wait(time.Hour)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting Acquire: %v, want DeadlineExceeded", err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}

	count := func(metric string, labels map[string]string) uint64 { return histogramCount(t, reg, metric, labels) }
	if got := count("fence_hold_seconds", map[string]string{"backend": "memory", "cause": "released"}); got != 2 {
		t.Errorf("released holds %d, want 2", got)
	}
	if got := counterSum(t, reg, "fence_leases_lost_total"); got != 0 {
		t.Errorf("fence_leases_lost_total sums to %v, want 0", got)
	}
	for result, want := range map[string]uint64{"acquired": 2, "held": 1, "cancelled": 1} {
		if got := count("fence_wait_seconds", map[string]string{"backend": "memory", "result": result}); got != want {
			t.Errorf("wait count for %s: %d, want %d", result, got, want)
		}
	}
}

// TestConcurrentEvents calls every method from many goroutines at once,
// under -race, and checks the totals.
func TestConcurrentEvents(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := fenceprom.New(reg, &fenceprom.Options{
		Classify:   func(r string) string { return r },
		MaxClasses: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, each = 8, 200
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				obs.AcquireDone(fence.AcquireEvent{Backend: "memory", Result: fence.Acquired, Wait: time.Millisecond})
				obs.LeaseEnded(fence.LeaseEvent{Backend: "memory", Cause: fence.LostExpired, Held: time.Second})
				obs.ReplicaSyncRefused(fence.ReplicaSyncEvent{Backend: "redis", Acked: 0, Required: 1})
				obs.GuardDecided(fence.GuardEvent{Resource: string(rune('a' + (g+i)%10)), Token: 1, Decision: fence.GuardAccept})
			}
		})
	}
	wg.Wait()
	for _, metric := range []string{"fence_acquisitions_total", "fence_leases_lost_total", "fence_replica_sync_refusals_total", "fence_guard_decisions_total"} {
		if got := counterSum(t, reg, metric); got != goroutines*each {
			t.Errorf("%s sums to %v, want %d", metric, got, goroutines*each)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "fence_guard_decisions_total"); err != nil || n != 8 {
		t.Errorf("fence_guard_decisions_total series %d (%v), want accept and reject for 3 classes and other", n, err)
	}
}

// TestTwoObserversOneRegistry: two Observers on one registry clash
// (AlreadyRegisteredError, as New's doc says), and with
// prometheus.WrapRegistererWith's constant labels they do not.
func TestTwoObserversOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := fenceprom.New(reg, nil); err != nil {
		t.Fatal(err)
	}
	var already prometheus.AlreadyRegisteredError
	if _, err := fenceprom.New(reg, nil); !errors.As(err, &already) {
		t.Fatalf("second New on one registry: %v, want an AlreadyRegisteredError", err)
	}
	reg = prometheus.NewRegistry() // label names must agree across one name's series
	a, err := fenceprom.New(prometheus.WrapRegistererWith(prometheus.Labels{"locker": "a"}, reg), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := fenceprom.New(prometheus.WrapRegistererWith(prometheus.Labels{"locker": "b"}, reg), nil)
	if err != nil {
		t.Fatal(err)
	}
	a.AcquireDone(fence.AcquireEvent{Backend: "memory", Result: fence.Acquired})
	b.AcquireDone(fence.AcquireEvent{Backend: "memory", Result: fence.Acquired})
	if got := counterSum(t, reg, "fence_acquisitions_total"); got != 2 {
		t.Fatalf("fence_acquisitions_total sums to %v, want 2", got)
	}
}
