package fenceprom_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fenceprom"
	"github.com/prometheus/client_golang/prometheus"
)

// counterValue returns the value of metric's series with exactly labels,
// and whether that series exists.
func counterValue(t *testing.T, reg *prometheus.Registry, metric string, labels map[string]string) (float64, bool) {
	t.Helper()
	m := series(t, reg, metric, labels)
	return m.GetCounter().GetValue(), m != nil
}

// TestAcquisitionResultsAtZero: a service whose Acquire calls all succeed
// has only fence_acquisitions_total{result="acquired"}. The natural alert
// on failing acquisitions, increase(fence_acquisitions_total{result=~
// "error|not_replicated"}[5m]) > 0, sees nothing when the first failure
// makes its series appear at 1 (the very reason the package creates
// fence_leases_lost_total at 0): the first outage of the backend (or of its
// replicas: fence_replica_sync_refusals_total had the same gap, see
// TestReplicaSyncRefusalSeenByIncrease) fires no alert until a second
// failure. The results are a fixed set:
// every one of them must be there at 0 from the backend's first event.
func TestAcquisitionResultsAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := fenceprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	obs.AcquireDone(fence.AcquireEvent{Backend: "redis", Result: fence.Acquired, Token: 1, Wait: time.Millisecond})
	for _, r := range []fence.AcquireResult{fence.Acquired, fence.Held, fence.NotReplicated, fence.Cancelled, fence.Failed} {
		want := 0.0
		if r == fence.Acquired {
			want = 1
		}
		if v, ok := counterValue(t, reg, "fence_acquisitions_total", map[string]string{"backend": "redis", "result": string(r)}); !ok || v != want {
			t.Errorf(`fence_acquisitions_total{backend="redis",result=%q}: %v, present %v; want %v, present`, r, v, ok, want)
		}
	}
}

// TestReplicaSyncRefusalSeenByIncrease: the README says to alert on
// fence_replica_sync_refusals_total. Its series carried acked and
// required, known only at a refusal, so none existed at 0 before the
// first one: that refusal's series appeared at 1, increase() over it was
// nothing, and the alert fired on the second refusal. Before the fix no
// fence_replica_sync_refusals_total{backend="redis",op="acquire"} series
// existed after the backend's first acquisition (present false), and the
// refusal made {acked="0",backend="redis",op="acquire",required="1"} at 1.
// Both ops' series must be there at 0 from the backend's first event, and
// a refusal must count in its (backend, op) series.
func TestReplicaSyncRefusalSeenByIncrease(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := fenceprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	obs.AcquireDone(fence.AcquireEvent{Backend: "redis", Result: fence.Acquired, Token: 1})
	for _, op := range []string{"acquire", "renew"} {
		if v, ok := counterValue(t, reg, "fence_replica_sync_refusals_total", map[string]string{"backend": "redis", "op": op}); !ok || v != 0 {
			t.Fatalf(`before any refusal, fence_replica_sync_refusals_total{backend="redis",op=%q}: %v, present %v; want 0, present`, op, v, ok)
		}
	}
	obs.ReplicaSyncRefused(fence.ReplicaSyncEvent{Backend: "redis", Name: "lock:payment:1001", Acked: 0, Required: 1})
	for op, want := range map[string]float64{"acquire": 1, "renew": 0} {
		if v, ok := counterValue(t, reg, "fence_replica_sync_refusals_total", map[string]string{"backend": "redis", "op": op}); !ok || v != want {
			t.Errorf(`after a refused acquisition, fence_replica_sync_refusals_total{backend="redis",op=%q}: %v, present %v; want %v, present`, op, v, ok, want)
		}
	}
}
