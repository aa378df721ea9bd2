package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// TestPasswordsHidden (issue 10, hole 4 for paymentd): -h and the errors of
// a bad URL show the defaults taken from the environment without their
// passwords.
func TestPasswordsHidden(t *testing.T) {
	env := map[string]string{
		"FENCE_REDIS_URL": "redis://u:hunter2@127.0.0.1:6379/0",
		"PAYMENT_DB":      "postgres://app:hunter3@db.example/pay?sslmode=disable&password=hunter4",
	}
	var help strings.Builder
	if _, err := parseFlags([]string{"-h"}, func(k string) string { return env[k] }, &help); err == nil {
		t.Fatal("-h did not stop")
	}
	if strings.Contains(help.String(), "hunter") || !strings.Contains(help.String(), "redis://u:xxxxx@127.0.0.1:6379/0") {
		t.Fatalf("-h shows a password, or no default:\n%s", help.String())
	}
	for _, bad := range []string{"redis://u:hunter2@[::1", "redis://u:hunter2@host:port"} {
		cfg, err := parseFlags([]string{"-redis", bad}, func(string) string { return "" }, &help)
		if err != nil {
			t.Fatal(err)
		}
		if err := run(context.Background(), cfg); err == nil || strings.Contains(err.Error(), "hunter") {
			t.Fatalf("malformed URL %q: %v", bad, err)
		}
	}
	if got := redact("host=db user=app password=hunter5 sslmode=disable"); strings.Contains(got, "hunter") {
		t.Fatalf("key=value DSN: %s", got)
	}
}

// TestMetrics: the -metrics handler serves the fence_* metrics the
// Observer counted, beside the Go runtime's.
func TestMetrics(t *testing.T) {
	obs, h, err := newMetrics()
	if err != nil {
		t.Fatal(err)
	}
	obs.AcquireDone(fence.AcquireEvent{Backend: "redis", Name: "lock:payment:1001", Result: fence.Held, Wait: time.Second})
	obs.LeaseEnded(fence.LeaseEvent{Backend: "redis", Name: "lock:payment:1001", Cause: fence.LostRemoved, Held: time.Second})
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`fence_acquisitions_total{backend="redis",result="held"} 1`,
		`fence_leases_lost_total{backend="redis",cause="removed"} 1`,
		`go_goroutines `,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(string(body), "lock:payment:1001") {
		t.Error("/metrics shows a lock name")
	}
}
