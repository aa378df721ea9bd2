package fenceprom_test

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/fenceprom"
	"github.com/fencekit/fence/internal/observetest/drive"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestScrapeAfterLossRefusalAndStaleWrite drives a real redis-server and a
// guard through a lost lease (its key deleted behind the holder's back), a
// replica-sync refusal (one replica expected, none connected) and a stale
// write, then scrapes /metrics and compares the counters exactly.
func TestScrapeAfterLossRefusalAndStaleWrite(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := fenceprom.New(reg, &fenceprom.Options{
		Classify: func(resource string) string { class, _, _ := strings.Cut(resource, ":"); return class },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fenceprom.New(reg, nil); err == nil {
		t.Fatal("a second Observer registered the same collectors")
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	drive.Events(t, obs)

	want := `
# HELP fence_acquisitions_total Acquire calls by backend and result (acquired, held, not_replicated, cancelled, error).
# TYPE fence_acquisitions_total counter
fence_acquisitions_total{backend="redis",result="acquired"} 2
fence_acquisitions_total{backend="redis",result="cancelled"} 0
fence_acquisitions_total{backend="redis",result="error"} 0
fence_acquisitions_total{backend="redis",result="held"} 0
fence_acquisitions_total{backend="redis",result="not_replicated"} 1
# HELP fence_guard_decisions_total Tokens a guard accepted or rejected as stale, by resource class.
# TYPE fence_guard_decisions_total counter
fence_guard_decisions_total{class="payment",decision="accept"} 1
fence_guard_decisions_total{class="payment",decision="reject"} 1
# HELP fence_leases_lost_total Leases that ended without Release, by backend and cause (expired, renew_failed, renew_late, removed).
# TYPE fence_leases_lost_total counter
fence_leases_lost_total{backend="redis",cause="expired"} 0
fence_leases_lost_total{backend="redis",cause="removed"} 1
fence_leases_lost_total{backend="redis",cause="renew_failed"} 0
fence_leases_lost_total{backend="redis",cause="renew_late"} 0
# HELP fence_replica_sync_refusals_total Acquisitions and renewals refused because too few replicas acknowledged them, by backend and op (acquire, renew).
# TYPE fence_replica_sync_refusals_total counter
fence_replica_sync_refusals_total{backend="redis",op="acquire"} 1
fence_replica_sync_refusals_total{backend="redis",op="renew"} 0
`
	names := []string{"fence_acquisitions_total", "fence_guard_decisions_total", "fence_leases_lost_total", "fence_replica_sync_refusals_total"}
	// The lost lease's end is reported just after its Done closes: poll.
	var last error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) { // polling with a deadline
		if last = testutil.ScrapeAndCompare(srv.URL, strings.NewReader(want), names...); last == nil {
			break
		}
	}
	if last != nil {
		t.Fatal(last)
	}

	// The histograms: three Acquire calls timed; two leases' ends, one
	// lost and one released.
	for _, tc := range []struct {
		metric string
		labels map[string]string
		count  uint64
	}{
		{"fence_wait_seconds", map[string]string{"backend": "redis", "result": "acquired"}, 2},
		{"fence_wait_seconds", map[string]string{"backend": "redis", "result": "not_replicated"}, 1},
		{"fence_hold_seconds", map[string]string{"backend": "redis", "cause": "removed"}, 1},
		{"fence_hold_seconds", map[string]string{"backend": "redis", "cause": "released"}, 1},
	} {
		if got := histogramCount(t, reg, tc.metric, tc.labels); got != tc.count {
			t.Errorf("%s%v count %d, want %d", tc.metric, tc.labels, got, tc.count)
		}
	}
}

// series returns metric's series with exactly labels, nil if there is none.
func series(t *testing.T, reg *prometheus.Registry, metric string, labels map[string]string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != metric {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

// histogramCount returns the sample count of the histogram metric with
// exactly labels.
func histogramCount(t *testing.T, reg *prometheus.Registry, metric string, labels map[string]string) uint64 {
	t.Helper()
	return series(t, reg, metric, labels).GetHistogram().GetSampleCount()
}
