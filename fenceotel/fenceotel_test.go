package fenceotel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fenceotel"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestCollectAfterLossRefusalAndStaleWrite is fenceprom's test through
// OpenTelemetry's SDK: a lease lost behind its holder's back on a real
// redis-server, a replica-sync refusal and a stale write, then the
// instruments collected with a manual reader and compared exactly.
func TestCollectAfterLossRefusalAndStaleWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	obs, err := fenceotel.New(provider.Meter("github.com/fencekit/fence"), &fenceotel.Options{
		Classify: func(resource string) string { class, _, _ := strings.Cut(resource, ":"); return class },
	})
	if err != nil {
		t.Fatal(err)
	}

	redis := redistest.Start(t)
	c := redis.Client(t)
	// 2 s: long enough that a slow round trip does not lose the lease
	// before the key is deleted; its watchdog notices the deletion within
	// a third of it.
	locker, err := redislock.New(c, &redislock.Options{WatchdogTTL: 2 * time.Second, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	stale, err := locker.Acquire(ctx, "lock:payment:1001")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, "fence:{lock:payment:1001}").Err(); err != nil {
		t.Fatal(err)
	}
	<-stale.Done()
	strict, err := redislock.New(c, &redislock.Options{Observer: obs,
		ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strict.Acquire(ctx, "lock:payment:1001", fence.TTL(time.Minute)); !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("Acquire with the expected replica missing: %v", err)
	}
	fresh, err := locker.Acquire(ctx, "lock:payment:1001", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	h := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{
		Resource: func(r *http.Request) (string, error) { return "payment:" + r.PathValue("id"), nil },
		Observer: obs,
	})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	mux := http.NewServeMux()
	mux.Handle("POST /payments/{id}", h)
	for _, tc := range []struct {
		lease fence.Lease
		code  int
	}{{fresh, http.StatusOK}, {stale, http.StatusConflict}} {
		req := httptest.NewRequest(http.MethodPost, "/payments/1001", nil)
		req.Header.Set(guard.TokenHeader, fmt.Sprint(int64(tc.lease.Token())))
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		if w.Code != tc.code {
			t.Fatalf("token %d: %d, want %d", tc.lease.Token(), w.Code, tc.code)
		}
	}
	if err := fresh.Release(ctx); err != nil {
		t.Fatal(err)
	}

	want := map[string]int64{
		"fence.acquisitions{backend=redis,result=acquired}":                        2,
		"fence.acquisitions{backend=redis,result=not_replicated}":                  1,
		"fence.guard.decisions{class=payment,decision=accept}":                     1,
		"fence.guard.decisions{class=payment,decision=reject}":                     1,
		"fence.leases.lost{backend=redis,cause=removed}":                           1,
		"fence.replica_sync.refusals{acked=0,backend=redis,op=acquire,required=1}": 1,
		"fence.wait.duration{backend=redis,result=acquired}":                       2,
		"fence.wait.duration{backend=redis,result=not_replicated}":                 1,
		"fence.hold.duration{backend=redis,cause=removed}":                         1,
		"fence.hold.duration{backend=redis,cause=released}":                        1,
	}
	// The lost lease's end is reported just after its Done closes: poll.
	var got map[string]int64
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
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
