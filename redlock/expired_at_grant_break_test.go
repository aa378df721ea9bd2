package redlock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// A lease whose deadline passes between the try's validity check and the
// start of its expiry timer (the machine was busy: a CI run of the
// conformance suite, with fence.MinTTL) ended as the Observer's timer was
// being armed, by the check for a lease with no timer, which reports
// nothing: the Observer never heard of its end. The clock here runs a lease
// time behind, so that every granted lease's deadline has passed when it
// starts.
func TestExpiredAtGrantIsReported(t *testing.T) {
	srvs := nodes(t, 3)
	rec := &recorder{}
	l := newLocker(t, srvs, &redlock.Options{NodeTimeout: generous, Observer: rec})
	const ttl = time.Second
	redlock.SetClock(l, func() time.Time { return time.Now().Add(-ttl) })
	lease, err := l.Acquire(ctxFor(t), "expired-at-grant", fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	select {
	case <-lease.Done():
	case <-ctxFor(t).Done():
		t.Fatal("the lease, granted past its deadline, did not end")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec.mu.Lock()
		n := len(rec.ends)
		rec.mu.Unlock()
		if n == 1 {
			break
		}
		if n > 1 || time.Now().After(deadline) {
			t.Fatalf("%d reports of the end of a lease granted past its deadline (Err %v); want 1", n, lease.Err())
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}
