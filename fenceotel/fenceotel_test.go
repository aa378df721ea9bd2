package fenceotel_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/fenceotel"
	"github.com/fencekit/fence/internal/observetest/drive"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestCollectAfterLossRefusalAndStaleWrite is fenceprom's test through
// OpenTelemetry's SDK: a lease lost behind its holder's back on a real
// redis-server, a replica-sync refusal and a stale write, then the
// instruments collected with a manual reader and compared exactly.
func TestCollectAfterLossRefusalAndStaleWrite(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	obs, err := fenceotel.New(provider.Meter("github.com/fencekit/fence"), &fenceotel.Options{
		Classify: func(resource string) string { class, _, _ := strings.Cut(resource, ":"); return class },
	})
	if err != nil {
		t.Fatal(err)
	}

	drive.Events(t, obs)

	want := map[string]int64{
		"fence.acquisitions{backend=redis,result=acquired}":        2,
		"fence.acquisitions{backend=redis,result=not_replicated}":  1,
		"fence.acquisitions{backend=redis,result=cancelled}":       0,
		"fence.acquisitions{backend=redis,result=error}":           0,
		"fence.acquisitions{backend=redis,result=held}":            0,
		"fence.guard.decisions{class=payment,decision=accept}":     1,
		"fence.guard.decisions{class=payment,decision=reject}":     1,
		"fence.leases.lost{backend=redis,cause=expired}":           0,
		"fence.leases.lost{backend=redis,cause=removed}":           1,
		"fence.leases.lost{backend=redis,cause=renew_failed}":      0,
		"fence.leases.lost{backend=redis,cause=renew_late}":        0,
		"fence.replica_sync.refusals{backend=redis,op=acquire}":    1,
		"fence.replica_sync.refusals{backend=redis,op=renew}":      0,
		"fence.wait.duration{backend=redis,result=acquired}":       2,
		"fence.wait.duration{backend=redis,result=not_replicated}": 1,
		"fence.hold.duration{backend=redis,cause=removed}":         1,
		"fence.hold.duration{backend=redis,cause=released}":        1,
	}
	// The lost lease's end is reported just after its Done closes: poll.
	var got map[string]int64
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) { // polling with a deadline
		if got = collect(t, reader); equal(got, want) {
			return
		}
	}
	t.Fatalf("collected %v\nwant %v", got, want)
}

// collect returns each counter's value and each histogram's count, keyed
// by name{attributes}.
func collect(t *testing.T, reader sdkmetric.Reader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	key := func(name string, set attribute.Set) string {
		var kv []string
		for _, a := range set.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.String())
		}
		return name + "{" + strings.Join(kv, ",") + "}"
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = int64(p.Count)
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

func equal(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
