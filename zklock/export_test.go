package zklock

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// Escape is escape, for the tests that look at the nodes.
var Escape = escape

// Listings returns how many times l listed a lock's directory.
func (l *Locker) Listings() int64 { return l.listings.Load() }

// Probes returns how many probes of the negotiated session timeout l
// started.
func (l *Locker) Probes() int64 { return l.probes.Load() }

// Background returns how many of l's background deletes and probe Closes
// are running.
func (l *Locker) Background() int64 { return l.background.Load() }

// Following returns how many leases s retimes at each grant.
func (s *SessionTimeouts) Following() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.leases)
}

// PassDeadline moves the deadline of fl, a lease, a millisecond into the
// past, as if it had passed before its expiry timer fired: the timer is
// set to fire a minute from now, and the lease's last contact an hour
// ahead, so that the monitor's checks (which move the deadline to a
// session timeout after the contact they were sent at) leave it alone. A
// lease with fence.TTL has its lease time run out then too, as a deadline
// that passes with the session alive does.
func PassDeadline(t *testing.T, fl fence.Lease) {
	t.Helper()
	ls := fl.(*lease)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.expiry == nil {
		t.Fatal("the lease has no expiry timer")
	}
	past := time.Now().Add(-time.Millisecond)
	if !ls.ttlEnd.IsZero() {
		ls.ttlEnd = past
	}
	ls.contact = time.Now().Add(time.Hour)
	ls.setDeadline(past)
	ls.expiry.Reset(time.Minute)
}

// Soon moves the deadline of fl, a lease with fence.TTL, and its expiry
// timer d from now, as if its lease time ran out then; its last contact
// an hour ahead, as PassDeadline.
func Soon(t *testing.T, fl fence.Lease, d time.Duration) {
	t.Helper()
	ls := fl.(*lease)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.ttlEnd.IsZero() {
		t.Fatal("Soon: a lease without fence.TTL")
	}
	at := time.Now().Add(d)
	ls.ttlEnd, ls.contact = at, time.Now().Add(time.Hour)
	ls.setDeadline(at)
	ls.expiry.Reset(d)
}

// SetDeadline sets the deadline of fl to d, under its mutex, as a reply or
// an Extend moves it: a deadline ahead resets the expiry timer to it; one
// past leaves the timer as it is. The last contact is moved an hour ahead,
// as PassDeadline does.
func SetDeadline(fl fence.Lease, d time.Time) {
	ls := fl.(*lease)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.contact = time.Now().Add(time.Hour)
	ls.setDeadline(d)
	if left := time.Until(d); left > 0 {
		ls.expiry.Reset(left)
	}
}

// LowerQuietly records to as the lowest session timeout granted to the
// connection's session, as a grant does, without retiming the leases s
// follows: the moment between a grant's record and its retimes (see
// authenticated), for the last leases retimed. undo restores the old one.
func (s *SessionTimeouts) LowerQuietly(to time.Duration) (undo func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.lowest
	s.lowest = to
	return func() { s.mu.Lock(); s.lowest = old; s.mu.Unlock() }
}
