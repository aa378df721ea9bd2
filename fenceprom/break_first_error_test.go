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
// replicas: the README's fence_replica_sync_refusals_total has the same
// gap) fires no alert until a second failure. The results are a fixed set:
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
// fence_replica_sync_refusals_total, but its series carry acked and
// required, unknown before the first refusal, so none exists at 0 before
// it: the first refusal's series appears at 1, and increase() over it is
// nothing.
func TestReplicaSyncRefusalSeenByIncrease(t *testing.T) {
	t.Skip("design question: fence_replica_sync_refusals_total{backend,op,acked,required} cannot be created at 0 before the first refusal, " +
		"since acked and required are only known then; so the README's alert on it misses the first refusal (it fires on the second). " +
		"Either drop acked and required from its labels (backend and op are known at the backend's first event, so both ops' series can start at 0; " +
		"the counts are in the logs and in `fence doctor`), or keep them and document that the alert should be on " +
		"fence_acquisitions_total{result=\"not_replicated\"} (at 0 from the backend's first event) or use Prometheus' created-timestamp zero ingestion. " +
		"I would drop the two labels: a refusal counter that an alert can see is worth more than the counts, which an operator reads elsewhere.")
	reg := prometheus.NewRegistry()
	obs, err := fenceprom.New(reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	obs.AcquireDone(fence.AcquireEvent{Backend: "redis", Result: fence.Acquired, Token: 1})
	if v, ok := counterValue(t, reg, "fence_replica_sync_refusals_total", map[string]string{"backend": "redis", "op": "acquire"}); !ok || v != 0 {
		t.Fatalf(`fence_replica_sync_refusals_total{backend="redis",op="acquire"}: %v, present %v; want 0, present`, v, ok)
	}
}
