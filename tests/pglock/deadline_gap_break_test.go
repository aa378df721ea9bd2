package pglock_test

import (
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/atomictime"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/pglock"
)

// passDeadline moves the deadline of fl, a pglock lease, a millisecond into
// the past, its expiry timer still waiting for the old one: the gap before
// the timer's goroutine runs, which is microseconds on an idle machine and
// more on a loaded one. pglock's own tests cannot reach a server (its
// module has no SQL driver), so this one reaches the lease's fields by
// reflection: mu, deadline, dl (Deadline's copy) and expiry. A field
// renamed fails the test here, not silently.
func passDeadline(t *testing.T, fl fence.Lease) {
	t.Helper()
	v := reflect.ValueOf(fl)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		t.Fatalf("lease %T: not a pointer to a struct", fl)
	}
	v = v.Elem()
	field := func(name string, typ reflect.Type) reflect.Value {
		t.Helper()
		f := v.FieldByName(name)
		if !f.IsValid() || f.Type() != typ {
			t.Fatalf("lease %T has no field %s of type %v", fl, name, typ)
		}
		return f
	}
	mu := (*sync.Mutex)(unsafe.Pointer(field("mu", reflect.TypeFor[sync.Mutex]()).UnsafeAddr()))
	deadline := (*time.Time)(unsafe.Pointer(field("deadline", reflect.TypeFor[time.Time]()).UnsafeAddr()))
	dl := (*atomictime.Time)(unsafe.Pointer(field("dl", reflect.TypeFor[atomictime.Time]()).UnsafeAddr()))
	expiry := field("expiry", reflect.TypeFor[*time.Timer]())
	mu.Lock()
	defer mu.Unlock()
	if expiry.IsNil() {
		t.Fatal("the lease has no expiry timer")
	}
	past := time.Now().Add(-time.Millisecond)
	*deadline = past
	dl.Store(past)
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
						return d.lockerWith(t, d.db, pglock.Options{Observer: obs, WatchdogTTL: time.Minute})
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
			return d.lockerWith(t, d.db, pglock.Options{Observer: obs, Logger: log, WatchdogTTL: time.Minute})
		},
		Pass:     passDeadline,
		Triggers: []string{"Err", "Context", "Done", "Release", "Extend"},
	})
}
