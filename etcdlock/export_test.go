package etcdlock

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// SpareIDs returns the etcd leases l keeps for reuse, oldest first.
func (l *Locker) SpareIDs() []clientv3.LeaseID {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]clientv3.LeaseID, len(l.spares))
	for i, sp := range l.spares {
		ids[i] = sp.id
	}
	return ids
}

// Raw reports whether the Locker sends its create Txn and delete as gRPC
// requests of its own (see rawKV).
func (l *Locker) Raw() bool { return l.kv != nil }

// HoldRuns keeps l's starter from starting the run of any lease acquired
// from now on (see starter): the starter believes its timer armed for
// long ago, so add arms it for no later lease. Such a lease's deadline can
// then be moved into the past (PassDeadline) with nothing on its way to
// end it at that deadline but the calls that find it passed: the gap
// before a run starts, or before its expiry timer's case is picked.
func HoldRuns(l *Locker) {
	s := &l.starter
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
	}
	s.at = time.Unix(0, 1)
}

// PassDeadline moves the deadline of fl, a lease of a Locker whose runs
// are held (HoldRuns), a millisecond into the past.
func PassDeadline(t *testing.T, fl fence.Lease) {
	t.Helper()
	ls := fl.(*Lease)
	s := &ls.l.starter
	s.mu.Lock()
	state := ls.runState
	s.mu.Unlock()
	if state != runPending {
		t.Fatalf("the lease's run is not held (state %d): HoldRuns before Acquire", state)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.setDeadline(time.Now().Add(-time.Millisecond))
}

// Soon moves the deadline of fl d from now, and its run's expiry timer
// with it: a run not started yet is started now (it reads the deadline as
// it starts), a started one is told that the deadline moved.
func Soon(t *testing.T, fl fence.Lease, d time.Duration) {
	t.Helper()
	ls := fl.(*Lease)
	ls.mu.Lock()
	ls.setDeadline(time.Now().Add(d))
	ls.mu.Unlock()
	s := &ls.l.starter
	s.mu.Lock()
	pending := ls.runState == runPending
	if pending {
		ls.runDue = time.Now()
	}
	s.mu.Unlock()
	if pending {
		s.fire()
		return
	}
	select {
	case ls.moved <- struct{}{}:
	default:
	}
}

// SetDeadline sets the deadline of fl to d, leaving its run (started or
// not) as it is.
func SetDeadline(fl fence.Lease, d time.Time) {
	ls := fl.(*Lease)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.setDeadline(d)
}

// Settling returns how many Extends of l are settling their move in the
// background (see settleBehind).
func Settling(l *Locker) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.settling)
}

// GivingBack returns how many revokes of etcd leases l retries in the
// background (see giveBack).
func GivingBack(l *Locker) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.givingBack)
}

// LockStarter holds l's starter (the mutex that startRun, as a new lease
// is made, and halt, as it is released, take) until the returned func is
// called: an Acquire that has listed its lease as held then stops there,
// before it returns the lease.
func LockStarter(l *Locker) (unlock func()) {
	l.starter.mu.Lock()
	return l.starter.mu.Unlock
}

// Held returns how many leases l lists as held, for Close to release.
func Held(l *Locker) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

// AgeSpares makes the etcd leases l keeps for reuse look d older (granted
// or renewed d earlier), so that a test need not wait for them to go
// stale.
func (l *Locker) AgeSpares(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.spares {
		l.spares[i].sent = l.spares[i].sent.Add(-d)
	}
}
