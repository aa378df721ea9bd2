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

// TestReplicaSyncRefusalsAtZero is fenceprom's
// TestReplicaSyncRefusalSeenByIncrease: the refusals carried acked and
// required, known only at a refusal, so no series existed before the first
// one and it appeared at 1, unseen by an alert on its increase. Before:
// "fence.replica_sync.refusals{backend=redis,op=acquire}: 0, present false".
func TestReplicaSyncRefusalsAtZero(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	obs, err := fenceotel.New(provider.Meter("github.com/fencekit/fence"), nil)
	if err != nil {
		t.Fatal(err)
	}
	obs.AcquireDone(fence.AcquireEvent{Backend: "redis", Result: fence.Acquired, Token: 1, Wait: time.Millisecond})
	for _, op := range []string{"acquire", "renew"} {
		k := "fence.replica_sync.refusals{backend=redis,op=" + op + "}"
		if v, ok := collect(t, reader)[k]; !ok || v != 0 {
			t.Errorf("before any refusal, %s: %d, present %v; want 0, present", k, v, ok)
		}
	}
	obs.ReplicaSyncRefused(fence.ReplicaSyncEvent{Backend: "redis", Acked: 0, Required: 1})
	got := collect(t, reader)
	if v := got["fence.replica_sync.refusals{backend=redis,op=acquire}"]; v != 1 {
		t.Errorf("after a refusal of an acquisition: op=acquire %d, want 1 (collected %v)", v, got)
	}
	if v, ok := got["fence.replica_sync.refusals{backend=redis,op=renew}"]; !ok || v != 0 {
		t.Errorf("after a refusal of an acquisition: op=renew %d, present %v; want 0, present", v, ok)
	}
}
