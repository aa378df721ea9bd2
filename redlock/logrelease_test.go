package redlock_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/redlock"
)

// A Logger's handler releases the lease when the watchdog logs that a
// renewal failed (two of three nodes gone): that Release must not wait for
// the watchdog, which is inside the handler. Before the fix it waited for
// ever (Release waits for the watchdog without a context).
func TestLoggerReleasesOnRenewalFailed(t *testing.T) {
	srvs := nodes(t, 3)
	h := observetest.NewReleaser("renewal failed")
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: 3 * time.Second, NodeTimeout: generous, Logger: slog.New(h)})
	lease, err := l.Acquire(ctxFor(t), "log-release")
	if err != nil {
		t.Fatal(err)
	}
	h.Set(lease)
	srvs[0].Kill()
	srvs[1].Kill()
	err = h.Await(t, 10*time.Second)
	t.Logf("Release from the handler: %v", err)
	if lease.Err() == nil {
		t.Fatal("the lease is held after Release from the handler")
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after Release")
	}
}
