package fenceotel_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fenceotel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestDurationBucketsInSeconds records a 30 ms wait and a 2 min hold and
// checks the histograms' bounds. The instruments are in seconds, but the
// SDK's default bounds (0, 5, 10, 25 … 10000) are made for milliseconds:
// every wait under 5 s fell in one bucket, and the histogram told nothing.
func TestDurationBucketsInSeconds(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	obs, err := fenceotel.New(provider.Meter("github.com/fencekit/fence"), nil)
	if err != nil {
		t.Fatal(err)
	}
	obs.AcquireDone(fence.AcquireEvent{Backend: "memory", Result: fence.Acquired, Wait: 30 * time.Millisecond})
	obs.LeaseEnded(fence.LeaseEvent{Backend: "memory", Cause: fence.Released, Held: 2 * time.Minute})

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				continue
			}
			seen++
			p := h.DataPoints[0]
			// The sample must fall in a bounded bucket whose lower bound
			// is at least a quarter of it: one that tells its size.
			i := 0
			for i < len(p.Bounds) && p.Sum > p.Bounds[i] {
				i++
			}
			if i == 0 || i == len(p.Bounds) || p.Bounds[i-1] < p.Sum/4 {
				t.Errorf("%s: %v s in bucket %d of bounds %v", m.Name, p.Sum, i, p.Bounds)
			}
		}
	}
	if seen != 2 {
		t.Fatalf("%d histograms collected, want 2", seen)
	}
}

// TestNewNilMeter: a nil Meter is bad input, refused with an error rather
// than a nil-pointer panic.
func TestNewNilMeter(t *testing.T) {
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("New(nil, nil) panicked: %v", p)
			}
		}()
		_, err = fenceotel.New(nil, nil)
	}()
	if !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("New(nil, nil): %v, want an error matching fence.ErrInvalidOption", err)
	}
}

// TestGuardDecisionWithInvalidUTF8Class gives the decisions counter a
// class that is not valid UTF-8 (a careless Classify that keeps the first
// 4 bytes of "café:1001": "caf\xc3"). The SDK keeps it as is, and an OTLP
// exporter then fails to marshal every export that holds it ("string field
// contains invalid UTF-8"): with cumulative temporality, every export from
// then on, all of fence's metrics and the application's with them.
func TestGuardDecisionWithInvalidUTF8Class(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	obs, err := fenceotel.New(provider.Meter("github.com/fencekit/fence"), &fenceotel.Options{
		Classify: func(resource string) string { return resource[:min(len(resource), 4)] },
	})
	if err != nil {
		t.Fatal(err)
	}
	obs.GuardDecided(fence.GuardEvent{Resource: "café:1001", Token: 7, Decision: fence.GuardAccept})
	got := collect(t, reader)
	if len(got) != 2 { // accept 1, reject 0
		t.Fatalf("collected %v, want accept and reject of one class", got)
	}
	for k := range got {
		if !utf8.ValidString(k) {
			t.Fatalf("collected %q: an attribute is not valid UTF-8", k)
		}
	}
}

// TestGuardClassesBounded: the README's Classify (the part before the
// first colon) on 1000 request-chosen resources without a colon made 1000
// class attribute values; the class must be capped, the rest "other".
func TestGuardClassesBounded(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	obs, err := fenceotel.New(provider.Meter("github.com/fencekit/fence"), &fenceotel.Options{
		Classify: func(resource string) string { class, _, _ := strings.Cut(resource, ":"); return class },
	})
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	for i := range n {
		obs.GuardDecided(fence.GuardEvent{Resource: fmt.Sprintf("x%d", i), Token: 7, Decision: fence.GuardAccept})
	}
	got := collect(t, reader)
	var sum int64
	for _, v := range got {
		sum += v
	}
	// Two series (accept, reject) per class, "other" included.
	if max := 2 * (fenceotel.DefaultMaxClasses + 1); len(got) > max || sum != n {
		t.Fatalf("%d series summing to %d after %d hostile resources, want at most %d summing to %d",
			len(got), sum, n, max, n)
	}
}

// TestNewRefusesNegativeMaxClasses: a negative cap is bad input.
func TestNewRefusesNegativeMaxClasses(t *testing.T) {
	provider := sdkmetric.NewMeterProvider()
	defer func() { _ = provider.Shutdown(context.Background()) }()
	if _, err := fenceotel.New(provider.Meter("github.com/fencekit/fence"), &fenceotel.Options{MaxClasses: -1}); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("New with MaxClasses -1: %v, want an error matching fence.ErrInvalidOption", err)
	}
}

// TestZeroSeriesToAlertOn: after one acquisition and one accepted write,
// the lost-lease counter of the backend's every loss cause, and the class's
// reject counter, must be there at 0. They did not exist before their first
// event, and a rate or increase over a series that appears at 1 (once
// exported to Prometheus, say) is nothing: the first lost lease never fired
// the alert.
func TestZeroSeriesToAlertOn(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	obs, err := fenceotel.New(provider.Meter("github.com/fencekit/fence"), &fenceotel.Options{
		Classify: func(resource string) string { class, _, _ := strings.Cut(resource, ":"); return class },
	})
	if err != nil {
		t.Fatal(err)
	}
	obs.AcquireDone(fence.AcquireEvent{Backend: "redis", Result: fence.Acquired, Token: 7})
	obs.GuardDecided(fence.GuardEvent{Resource: "payment:1001", Token: 7, Decision: fence.GuardAccept})
	got := collect(t, reader)
	for _, k := range []string{
		"fence.leases.lost{backend=redis,cause=expired}",
		"fence.leases.lost{backend=redis,cause=removed}",
		"fence.leases.lost{backend=redis,cause=renew_failed}",
		"fence.leases.lost{backend=redis,cause=renew_late}",
		"fence.guard.decisions{class=payment,decision=reject}",
	} {
		if v, ok := got[k]; !ok || v != 0 {
			t.Errorf("%s: %d, present %v; want 0, present", k, v, ok)
		}
	}
}
