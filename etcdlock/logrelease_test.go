package etcdlock_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	"github.com/fencekit/fence/internal/observetest"
)

// A Logger's handler releases the lease when the watchdog logs that a
// renewal failed (the server killed): that Release must not wait for run,
// which is inside the handler. Before the fix, once its delete gave up
// (the server is gone), it waited for ever: Release joins run without a
// context.
func TestLoggerReleasesOnRenewalFailed(t *testing.T) {
	c := etcdtest.Start(t)
	h := observetest.NewReleaser("renewal failed")
	// Release's delete is retried until its context ends, with the server
	// gone: then it joins run.
	h.Timeout = 3 * time.Second
	l := newLocker(t, c.Endpoints(), &etcdlock.Options{WatchdogTTL: 3 * time.Second, Logger: slog.New(h)})
	lease, err := l.Acquire(ctxFor(t, 30*time.Second), "log-release")
	if err != nil {
		t.Fatal(err)
	}
	h.Set(lease)
	c.Members[0].Kill()
	h.AwaitEnded(t, 10*time.Second)
}
