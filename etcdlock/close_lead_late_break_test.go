package etcdlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// TestLeadStopsAtOnceOnLateTakeAfterClose: a campaign of fence.Lead whose
// create Txn took the lock but answered past the lease's deadline, on a
// Locker closed meanwhile, fails with an error matching both
// fence.ErrLeaseLost (the late take, given back) and fence.ErrClosed (not
// tried again: TestCloseDuringLateTake). Lead took it as a lost lease and
// paused before campaigning again, only to be refused then: with a
// back-off of 5 to 10 s it returned 2.63 s after Close had ('Lead still
// running 1 s after Close returned'), its goroutine left to the caller
// meanwhile. No campaign can succeed on a closed Locker; Lead must return
// at once, as its doc says it does once a campaign fails with ErrClosed.
func TestLeadStopsAtOnceOnLateTakeAfterClose(t *testing.T) {
	const ttl = time.Second
	var delays atomic.Int64
	l, err := etcdlock.New(delayingClient(t, shared.Endpoints(), &delays, ttl), nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, shared.Endpoints(), nil)
	pfx := l.Prefix(t.Name())
	delays.Store(1)
	led := make(chan error, 1)
	go func() {
		led <- fence.Lead(ctxFor(t, 30*time.Second), l, t.Name(), func(context.Context, fence.Lease) error {
			t.Error("elected on a Locker closed during its campaign")
			return nil
		}, fence.LeaseOptions(fence.TTL(ttl), fence.Wait(10*time.Second)), fence.Backoff(5*time.Second, 10*time.Second))
	}()
	// The create Txn was applied; its reply is held for the lease time.
	for end := time.Now().Add(10 * time.Second); countKeys(t, admin, pfx) == 0; {
		if time.Now().After(end) {
			t.Fatal("no key created after 10 s")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	if err := l.Close(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	select {
	case err := <-led:
		t.Logf("Lead = %v, %v after Close returned", err, time.Since(closed).Round(time.Millisecond))
		if !errors.Is(err, fence.ErrClosed) {
			t.Errorf("Lead = %v, want an error matching fence.ErrClosed", err)
		}
	case <-time.After(time.Second):
		err := <-led // for goleak: it returns once its back-off is over
		t.Fatalf("Lead still running 1 s after Close returned; it returned %v after Close, with %v", time.Since(closed).Round(time.Millisecond), err)
	}
	if n := countKeys(t, admin, pfx); n != 0 {
		t.Errorf("%d key(s) left after Lead returned", n)
	}
}
