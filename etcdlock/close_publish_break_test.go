package etcdlock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// A lease is listed as held (and so seen by a Close called then, which
// releases it from its own goroutine) before Acquire has finished making
// it: Acquire set the lease's noReuse field after the lease was listed,
// with nothing ordering that write before the read of Close's Release.
// Stopped right after the listing (the starter held), with Close called
// there, -race reported 'DATA RACE' on the field (in a run of
// -count=20): written by Locker.create (etcdlock.go:807, after newLease),
// read by Close's Lease.Release (lease.go:1352). Now newLease sets it
// before the lease is listed.
func TestCloseWhileAcquireListsLease(t *testing.T) {
	l := newLocker(t, shared.Endpoints(), nil)
	unlock := etcdlock.LockStarter(l)
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	acquired := make(chan error, 1)
	var lease fence.Lease
	go func() {
		var err error
		lease, err = l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(time.Minute))
		acquired <- err
	}()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	limit := time.After(10 * time.Second)
	for etcdlock.Held(l) == 0 {
		select {
		case <-tick.C:
		case err := <-acquired:
			t.Fatalf("Acquire returned before listing its lease: %v", err)
		case <-limit:
			t.Fatal("the lease was not listed as held within 10 s")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctxFor(t, 10*time.Second)) }()
	unlock()
	locked = false
	if err := <-acquired; err != nil {
		t.Fatalf("Acquire = %v, want the lease listed before Close came", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := lease.Err(); err != fence.ErrReleased {
		t.Errorf("the lease's Err after Close = %v, want fence.ErrReleased", err)
	}
	if n := countKeys(t, newClient(t, shared.Endpoints(), nil), l.Prefix(t.Name())); n != 0 {
		t.Errorf("%d keys left after Close", n)
	}
}
