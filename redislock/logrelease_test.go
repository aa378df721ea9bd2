package redislock_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// A Logger's handler releases the lease when the watchdog logs that a
// renewal failed (the server is gone): that Release must not wait for the
// watchdog, which is inside the handler. Before the fix it waited out its
// 20 s context ("the watchdog's renewal is still running").
func TestLoggerReleasesOnRenewalFailed(t *testing.T) {
	t.Parallel() // own server and Logger; mostly waits for the lease to end
	srv := redistest.Start(t)
	h := observetest.NewReleaser("renewal failed")
	l := newLockerWith(t, srv.Client(t), redislock.Options{WatchdogTTL: 3 * time.Second, Logger: slog.New(h)})
	lease := acquire(t, l, "log-release")
	h.Set(lease)
	srv.Kill()
	h.AwaitEnded(t, 10*time.Second)
}
