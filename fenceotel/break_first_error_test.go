package fenceotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fenceotel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// TestAcquisitionResultsAtZero is fenceprom's: after a backend's first
// event every result of fence.acquisitions must be there at 0, so that an
// alert on the rate of failing acquisitions (error, not_replicated) fires
// on the first failure, not the second (a series that appears at 1, once
// in Prometheus, gives increase() nothing).
func TestAcquisitionResultsAtZero(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	obs, err := fenceotel.New(provider.Meter("github.com/fencekit/fence"), nil)
	if err != nil {
		t.Fatal(err)
	}
	obs.AcquireDone(fence.AcquireEvent{Backend: "redis", Result: fence.Acquired, Token: 1, Wait: time.Millisecond})
	got := collect(t, reader)
	for _, r := range []fence.AcquireResult{fence.Acquired, fence.Held, fence.NotReplicated, fence.Cancelled, fence.Failed} {
		want := int64(0)
		if r == fence.Acquired {
			want = 1
		}
		k := "fence.acquisitions{backend=redis,result=" + string(r) + "}"
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s: %d, present %v; want %d, present", k, v, ok, want)
		}
	}
}
