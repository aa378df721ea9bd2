package observetest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// ReplyHold holds back the reply of one call, once armed: a backend's
// test calls Hold from its client's hook after the call ran, and Hold
// tells Arm's ran and waits for open. The zero value is disarmed.
type ReplyHold struct {
	armed     atomic.Bool
	ran, open chan struct{}
}

// Arm makes the next Hold hold its reply: ran is told when the call has
// run, and open lets its reply go.
func (h *ReplyHold) Arm() (ran <-chan struct{}, open func()) {
	h.ran, h.open = make(chan struct{}, 1), make(chan struct{})
	h.armed.Store(true)
	return h.ran, func() { h.armed.Store(false); close(h.open) }
}

// Hold holds the reply of the call that ran, if armed (once).
func (h *ReplyHold) Hold() {
	if h.armed.CompareAndSwap(true, false) {
		h.ran <- struct{}{}
		<-h.open
	}
}

// LateRenewal says how a backend's test makes a renewal that the backend
// ran in time whose reply is read after the lease's deadline passed, for
// RenewalReadPastDeadline.
type LateRenewal struct {
	// New returns a Locker with obs as its Observer whose Extend goes
	// through Hold's hook, and whose leases' timers (or runs) do not end
	// them meanwhile.
	New  func(t *testing.T, obs fence.Observer) fence.Locker
	Hold *ReplyHold
	// Pass moves lease's deadline into the past, its timer left as it is.
	Pass func(t *testing.T, lease fence.Lease)
	// Ended, if not nil, checks what the backend leaves of a lease that
	// ended while its renewal's reply was out (etcdlock: its key deleted).
	Ended func(t *testing.T, lease fence.Lease)
}

// RenewalReadPastDeadline checks, with then "nothing", "Err" or
// "Release" called while the reply of an Extend run in time is out and
// the lease's deadline has passed: with nothing looking at the lease
// meanwhile, the lock was held throughout and Extend returns nil with the
// new Deadline (fence.Lease's Deadline doc); if Err is called, or Release
// (which waits for the Extend), it ends the lease, reported once as an
// expiry, and the late reply must not bring it back: Extend returns the
// loss, Err keeps it, the Deadline does not move, Release returns the loss
// too, and nothing more is reported.
func RenewalReadPastDeadline(t *testing.T, r LateRenewal, then string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := &Recorder{}
	l := r.New(t, rec)
	ls, err := l.Acquire(ctx, "deadline-gap:renew-late-read:"+then, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ran, open := r.Hold.Arm()
	opened := false
	defer func() {
		if !opened {
			open()
		}
	}()
	ext := make(chan error, 1)
	go func() { ext <- ls.Extend(ctx, time.Minute) }()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the renewal did not run")
	}
	r.Pass(t, ls) // passed while the reply is out
	var seen error
	rel := make(chan error, 1)
	switch then {
	case "Err":
		seen = ls.Err()
	case "Release":
		go func() { rel <- ls.Release(ctx) }()
		select {
		case <-ls.Done(): // Release ended it before it waits for the renewal
		case <-time.After(10 * time.Second):
			t.Fatal("Release past the deadline, a renewal's reply out, did not end the lease")
		}
		seen = ls.Err()
	}
	if then != "nothing" && !errors.Is(seen, fence.ErrLeaseLost) {
		t.Errorf("Err past the deadline, the renewal's reply out, %s called = %v, want ErrLeaseLost", then, seen)
	}
	opened = true
	open()
	err = <-ext
	if then == "nothing" {
		if err != nil {
			t.Errorf("Extend run in time, its reply read after the deadline = %v, want nil", err)
		}
		if e := ls.Err(); e != nil {
			t.Errorf("Err after it = %v, want nil", e)
		}
		if left := time.Until(ls.Deadline()); left < 30*time.Second {
			t.Errorf("Deadline in %v after Extend(1m)", left)
		}
		if ends := rec.Ends(); len(ends) != 0 {
			t.Errorf("ends reported %+v, want none", ends)
		}
		if err := ls.Release(ctx); err != nil {
			t.Errorf("Release = %v", err)
		}
		return
	}
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Extend whose reply came after %s ended the lease = %v, want ErrLeaseLost", then, err)
	}
	if then == "Release" {
		if err := <-rel; !errors.Is(err, fence.ErrLeaseLost) || err.Error() != seen.Error() {
			t.Errorf("Release = %v, want %v", err, seen)
		}
	}
	if e := ls.Err(); e != seen {
		t.Errorf("Err after the late reply = %v, want %v still", e, seen)
	}
	if time.Now().Before(ls.Deadline()) {
		t.Errorf("the late reply moved the Deadline of an ended lease to %v from now", time.Until(ls.Deadline()))
	}
	if ends := rec.Ends(); len(ends) != 1 || ends[0].Cause != fence.LostExpired {
		t.Errorf("ends reported %+v, want one, expired", ends)
	}
	if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release = %v, want ErrLeaseLost", err)
	}
	if ends := rec.Ends(); len(ends) != 1 {
		t.Errorf("ends reported after Release %+v, want one", ends)
	}
	if r.Ended != nil {
		r.Ended(t, ls)
	}
}
