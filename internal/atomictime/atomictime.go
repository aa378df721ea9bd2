// Package atomictime holds a time.Time that one goroutine may read while
// another writes it, without a lock: a lease's Deadline, which fence.Run
// reads from fn's context (see fence.Lease.Deadline: it must not block, as
// a Locker may ask fn's context whether it is done while it holds the
// lease's lock).
package atomictime

import (
	"math"
	"sync/atomic"
	"time"
)

// base is the reading that times are kept relative to: its monotonic
// clock reading carries over to every time Load returns.
var base = time.Now()

// zero stands for the zero time.Time.
const zero = math.MinInt64

// Time is a time.Time read and written atomically. Load returns a time
// with the monotonic clock reading of the time stored, so that Before,
// After and Sub against time.Now() use the monotonic clock, as they did on
// the time stored (if it had one); its wall clock reading is the current
// wall clock's plus the monotonic difference from now, which differs from
// the stored one only if the wall clock was stepped since Store. The zero
// Time holds the zero time.Time.
type Time struct {
	ns   atomic.Int64 // since base, or zero
	init atomic.Bool  // false: ns not written yet (the zero time)
}

// Store sets t to v.
func (t *Time) Store(v time.Time) {
	if v.IsZero() {
		t.ns.Store(zero)
	} else {
		t.ns.Store(int64(v.Sub(base)))
	}
	t.init.Store(true)
}

// Load returns what Store set last, the zero time if it never ran.
func (t *Time) Load() time.Time {
	if !t.init.Load() {
		return time.Time{}
	}
	ns := t.ns.Load()
	if ns == zero {
		return time.Time{}
	}
	// Counted from now, not from base: base.Add(ns) has the right
	// monotonic reading, but base's wall reading plus the monotonic
	// difference, off by every step of the wall clock (or suspension of
	// the machine) since the process started. now.Add keeps the monotonic
	// reading and puts the wall reading where the current wall clock
	// says the time is (the stored one, unless the clock was stepped
	// since it was stored).
	now := time.Now()
	return now.Add(base.Add(time.Duration(ns)).Sub(now))
}
