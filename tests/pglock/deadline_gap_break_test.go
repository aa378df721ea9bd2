package pglock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/atomictime"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/pglock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// leaseFields are pointers to a pglock lease's fields that the tests of
// its deadline move. pglock's own tests cannot reach a server (its module
// has no SQL driver), so these reach the lease's fields by reflection: a
// field renamed fails the test in leaseOf, not silently.
type leaseFields struct {
	mu       *sync.Mutex
	deadline *time.Time
	dl       *atomictime.Time // Deadline's copy of deadline
	expiry   **time.Timer
}

func leaseOf(t *testing.T, fl fence.Lease) leaseFields {
	t.Helper()
	v := reflect.ValueOf(fl)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		t.Fatalf("lease %T: not a pointer to a struct", fl)
	}
	v = v.Elem()
	field := func(name string, typ reflect.Type) unsafe.Pointer {
		t.Helper()
		f := v.FieldByName(name)
		if !f.IsValid() || f.Type() != typ {
			t.Fatalf("lease %T has no field %s of type %v", fl, name, typ)
		}
		return unsafe.Pointer(f.UnsafeAddr())
	}
	return leaseFields{
		mu:       (*sync.Mutex)(field("mu", reflect.TypeFor[sync.Mutex]())),
		deadline: (*time.Time)(field("deadline", reflect.TypeFor[time.Time]())),
		dl:       (*atomictime.Time)(field("dl", reflect.TypeFor[atomictime.Time]())),
		expiry:   (**time.Timer)(field("expiry", reflect.TypeFor[*time.Timer]())),
	}
}

// setDeadline sets the lease's deadline (and Deadline's copy) to d, under
// its mutex, and returns its expiry timer, which it leaves as it is.
func (f leaseFields) setDeadline(t *testing.T, d time.Time) *time.Timer {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if *f.expiry == nil {
		t.Fatal("the lease has no expiry timer")
	}
	*f.deadline = d
	f.dl.Store(d)
	return *f.expiry
}

// passDeadline moves the deadline of fl, a pglock lease, a millisecond into
// the past, its expiry timer still waiting for the old one: the gap before
// the timer's goroutine runs, which is microseconds on an idle machine and
// more on a loaded one.
func passDeadline(t *testing.T, fl fence.Lease) {
	t.Helper()
	leaseOf(t, fl).setDeadline(t, time.Now().Add(-time.Millisecond))
}

// soon moves the deadline of fl, a pglock lease, and its expiry timer d
// from now.
func soon(t *testing.T, fl fence.Lease, d time.Duration) {
	t.Helper()
	f := leaseOf(t, fl)
	f.mu.Lock() // as renew resets it, under the lease's mutex
	defer f.mu.Unlock()
	*f.deadline = time.Now().Add(d)
	f.dl.Store(*f.deadline)
	(*f.expiry).Reset(d)
}

// TestObservedLeaseEndsAtDeadlineBeforeItsTimer: as redislock's and
// redlock's. A lease whose deadline has passed is lost, whether or not its
// expiry timer's goroutine has run yet. Err used to return only what the
// timer had recorded: in the gap before it ran, Err said the lease was
// held, Done was open, and Release freed the row and returned nil
// (reported Released). Each of Err, Context, Done, Release and Extend,
// called first, must end the lease as the timer would (LostExpired, or
// LostRenewFailed for a watchdog lease, with the timer's error), reported
// once by the time it returns; the others then agree.
func TestObservedLeaseEndsAtDeadlineBeforeItsTimer(t *testing.T) {
	d := newDatabase(t, pg)
	for _, watchdog := range []bool{false, true} {
		for _, first := range []string{"Err", "Context", "Done", "Release", "Extend"} {
			t.Run(fmt.Sprintf("watchdog=%v/%s", watchdog, first), func(t *testing.T) {
				observetest.PastDeadlineEnds(t, observetest.PastDeadlineCase{
					New: func(t *testing.T, obs fence.Observer) fence.Locker {
						return minuteWatchdog(t, d, pglock.Options{Observer: obs})
					},
					Pass:       passDeadline,
					Watchdog:   watchdog,
					First:      first,
					Expired:    "its lease time ran out",
					NotRenewed: "was not renewed before its deadline",
				})
			})
		}
	}
}

// TestReentryAtEndPastDeadline: see observetest.ReentryAtEndPastDeadline.
// The end of a lease past its deadline is reported by whichever call finds
// it; a callback that calls the lease back must not deadlock on it (Release
// and Extend wait for ls.op, Release for the watchdog) nor see it held.
func TestReentryAtEndPastDeadline(t *testing.T) {
	d := newDatabase(t, pg)
	observetest.ReentryAtEndPastDeadline(t, observetest.PastDeadline{
		New: func(t *testing.T, obs fence.Observer, log *slog.Logger) fence.Locker {
			return minuteWatchdog(t, d, pglock.Options{Observer: obs, Logger: log})
		},
		Pass:     passDeadline,
		Triggers: []string{"Err", "Context", "Done", "Release", "Extend"},
	})
}

// TestCallRacesExpiry: the expiry timer and the first of Err or Release
// find the deadline passed at about the same moment (it is moved a few
// microseconds away): the lease ends once, and what is reported agrees
// with what Err and Release returned; see observetest.CallRacesExpiry.
func TestCallRacesExpiry(t *testing.T) {
	d := newDatabase(t, pg)
	for _, first := range []string{"Err", "Release"} {
		t.Run(first, func(t *testing.T) {
			observetest.CallRacesExpiry(t, observetest.ExpiryRace{
				New: func(t *testing.T, obs fence.Observer) fence.Locker {
					return d.lockerWith(t, d.db, pglock.Options{Observer: obs})
				},
				Soon:    soon,
				Expired: "its lease time ran out",
			}, first)
		})
	}
}

// TestRenewalReadPastDeadline: as redislock's
// TestRenewalReadPastDeadlineKeepsLease and TestReleaseWaitingForKeptRenewal.
// A renewal that the database ran in time, whose reply is read after the
// lease's deadline passed (its timer still waiting): with nothing looking
// at the lease meanwhile, the lock was held throughout and Extend returns
// nil with the new Deadline (fence.Lease's Deadline doc). If Err is called
// meanwhile, or Release (which waits for the renewal's turn), it ends the
// lease, reported once as an expiry: the late reply must not bring it back
// (Extend returns the loss, Err keeps it, the Deadline does not move, and
// Release returns the loss too), and nothing else is reported.
func TestRenewalReadPastDeadline(t *testing.T) {
	d := newDatabase(t, pg)
	h := &observetest.ReplyHold{}
	db := sql.OpenDB(holdingConnector{stdlib.GetConnector(mustParse(t, d.dsn)), h})
	t.Cleanup(func() { _ = db.Close() })
	late := observetest.LateRenewal{
		New: func(t *testing.T, obs fence.Observer) fence.Locker {
			return d.lockerWith(t, db, pglock.Options{Observer: obs})
		},
		Hold: h,
		Pass: passDeadline,
	}
	for _, then := range []string{"nothing", "Err", "Release"} {
		t.Run(then, func(t *testing.T) { observetest.RenewalReadPastDeadline(t, late, then) })
	}
}

func mustParse(t *testing.T, dsn string) pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return *cfg
}

// holdingConnector is a driver.Connector whose connections hold the
// replies of renewals as h says.
type holdingConnector struct {
	driver.Connector
	h *observetest.ReplyHold
}

func (c holdingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return holdingConn{conn.(*stdlib.Conn), c.h}, nil
}

type holdingConn struct {
	*stdlib.Conn
	h *observetest.ReplyHold
}

func (c holdingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	res, err := c.Conn.ExecContext(ctx, q, args)
	if err == nil && strings.Contains(q, "SET expires_at = greatest(expires_at") && !strings.Contains(q, "RETURNING") {
		c.h.Hold()
	}
	return res, err
}

// TestReleaseAsDeadlineMovesReportsOnce: see
// observetest.ReleaseAsDeadlineMoves. Release's checks of the deadline race
// a goroutine that moves it as renewals do (under the lease's mutex).
func TestReleaseAsDeadlineMovesReportsOnce(t *testing.T) {
	d := newDatabase(t, pg)
	observetest.ReleaseAsDeadlineMoves(t, observetest.DeadlineFlip{
		New: func(t *testing.T, obs fence.Observer) fence.Locker {
			return d.lockerWith(t, d.db, pglock.Options{Observer: obs})
		},
		// leaseOf's fields were checked by the tests above; t.Fatal here
		// would run on the flipping goroutine.
		Set: func(fl fence.Lease, at time.Time) { leaseOf(t, fl).setDeadline(t, at) },
	})
}
