package pglock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/pglock"
	"github.com/jackc/pgx/v5/stdlib"
)

// gapAttack is observetest's GapAttack for pglock on d.
func gapAttack(t *testing.T, d database) observetest.GapAttack {
	return observetest.GapAttack{
		New: func(t *testing.T, obs fence.Observer) fence.Locker {
			return minuteWatchdog(t, d, pglock.Options{Observer: obs})
		},
		Pass: passDeadline,
		Set:  func(fl fence.Lease, at time.Time) { leaseOf(t, fl).setDeadline(t, at) },
	}
}

// TestConcurrentCallsPastDeadline: see
// observetest.ConcurrentCallsPastDeadline. Eight goroutines find a lease
// past its deadline at once (Release and Extend among them, which wait for
// ls.op), the Observer calls it back: one end, reported by the one that
// made it before it returned, and every call says lost.
func TestConcurrentCallsPastDeadline(t *testing.T) {
	d := newDatabase(t, pg)
	for _, watchdog := range []bool{false, true} {
		t.Run(fmt.Sprintf("watchdog=%v", watchdog), func(t *testing.T) {
			observetest.ConcurrentCallsPastDeadline(t, gapAttack(t, d), watchdog)
		})
	}
}

// TestHeldLeaseCallsDoNotAllocate: see
// observetest.HeldLeaseCallsDoNotAllocate.
func TestHeldLeaseCallsDoNotAllocate(t *testing.T) {
	observetest.HeldLeaseCallsDoNotAllocate(t, gapAttack(t, newDatabase(t, pg)))
}

// TestReleasedThenPastDeadline: see observetest.ReleasedThenPastDeadline.
func TestReleasedThenPastDeadline(t *testing.T) {
	d := newDatabase(t, pg)
	for _, failFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("failFirst=%v", failFirst), func(t *testing.T) {
			observetest.ReleasedThenPastDeadline(t, gapAttack(t, d), failFirst)
		})
	}
}

// failRenewals, when armed, fails renewals' statements (unsent).
type failRenewals struct{ armed atomic.Bool }

type failingConnector struct {
	driver.Connector
	f *failRenewals
}

func (c failingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return failingConn{conn.(*stdlib.Conn), c.f}, nil
}

type failingConn struct {
	*stdlib.Conn
	f *failRenewals
}

func (c failingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	if c.f.armed.Load() && strings.Contains(q, "SET expires_at = greatest(expires_at") && !strings.Contains(q, "RETURNING") {
		return nil, errors.New("test: renewal refused")
	}
	return c.Conn.ExecContext(ctx, q, args)
}

// TestCallAtFailedRenewal: see observetest.CallAtFailedRenewal. The
// Logger's handler, told on the watchdog's goroutine that a renewal
// failed, finds the lease past its deadline with one of its calls, which
// ends and reports it there; the Observer's callback then calls Release
// (which waits for the watchdog unless it is logging) and Extend.
func TestCallAtFailedRenewal(t *testing.T) {
	d := newDatabase(t, pg)
	f := &failRenewals{}
	f.armed.Store(true)
	db := sql.OpenDB(failingConnector{stdlib.GetConnector(mustParse(t, d.dsn)), f})
	t.Cleanup(func() { _ = db.Close() })
	for _, call := range []string{"Err", "Done", "Context", "Release", "Extend"} {
		t.Run(call, func(t *testing.T) {
			observetest.CallAtFailedRenewal(t, "renewal failed", call,
				func(t *testing.T, obs fence.Observer, log *slog.Logger) fence.Locker {
					// Renewed a second in.
					return d.lockerWith(t, db, pglock.Options{Observer: obs, Logger: log, WatchdogTTL: 3 * time.Second})
				},
				func(ls fence.Lease) { leaseOf(t, ls).setDeadline(t, time.Now().Add(-time.Millisecond)) })
		})
	}
}

// minuteWatchdog is d.lockerWith on d.db with o, but with the watchdog TTL
// of a minute that observetest's PastDeadline, PastDeadlineCase and
// GapAttack ask for: lockerWith sets the package's watchdogTTL (1 s),
// whose expiry timer and renewals (every third of it, each of which ends a
// lease found past its deadline, quietly, leaving the report to the
// watchdog's goroutine) closed the gap those tests open within it.
func minuteWatchdog(t *testing.T, d database, o pglock.Options) fence.Locker {
	t.Helper()
	o.WatchdogTTL, o.Listener = time.Minute, pgxListener{d.dsn}
	l, err := pglock.New(d.db, &o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
