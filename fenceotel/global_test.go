package fenceotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fenceotel"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestDocExampleGlobalProvider follows doc.go: New with the global
// provider's Meter, made before the application installs its SDK provider
// (the usual order: libraries at init, the SDK in main). Events recorded
// after the SDK is installed must be collected, with the seconds buckets.
// It sets the global provider: no other test of this package uses it.
func TestDocExampleGlobalProvider(t *testing.T) {
	obs, err := fenceotel.New(otel.GetMeterProvider().Meter("github.com/fencekit/fence"), nil)
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	otel.SetMeterProvider(provider)

	obs.AcquireDone(fence.AcquireEvent{Backend: "memory", Result: fence.Acquired, Wait: 30 * time.Millisecond})
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "fence.wait.duration" {
				if p := h.DataPoints[0]; p.Count != 1 || len(p.Bounds) == 0 || p.Bounds[0] != 0.005 {
					t.Fatalf("fence.wait.duration: count %d, bounds %v; want 1, from 0.005", p.Count, p.Bounds)
				}
				return
			}
		}
	}
	t.Fatal("no fence.wait.duration collected")
}
