package pglock_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/pglock"
)

// A Logger's handler releases the lease when the watchdog logs that a
// renewal failed (its database handle closed): that Release must not wait
// for the watchdog, which is inside the handler. Before the fix it waited
// for ever (Release waits for the watchdog without a context).
func TestLoggerReleasesOnRenewalFailed(t *testing.T) {
	d := newDatabase(t, pg)
	db := open(t, d.dsn, nil)
	h := observetest.NewReleaser("renewal failed")
	l, err := pglock.New(db, &pglock.Options{WatchdogTTL: 3 * time.Second, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 30*time.Second), "log-release")
	if err != nil {
		t.Fatal(err)
	}
	h.Set(lease)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	h.AwaitEnded(t, 10*time.Second)
}
