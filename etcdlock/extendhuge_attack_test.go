package etcdlock_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// TestExtendTooLongKeepsLease: Extend with a lease time past etcd's
// maximum is refused (fence.ErrInvalidOption) before anything is sent, and
// the live lease it was asked of is untouched: still held, same deadline,
// same etcd lease, and a later Extend within the maximum works. A watchdog
// Locker whose WatchdogTTL is exactly etcd's maximum is accepted, one a
// nanosecond past it refused.
func TestExtendTooLongKeepsLease(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, nil)
	ctx := ctxFor(t, 30*time.Second)
	lease, err := l.Acquire(ctx, "extend-huge", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	id, dl := leaseID(t, lease), lease.Deadline()
	const most = 9_000_000_000 * time.Second
	for _, ttl := range []time.Duration{most + time.Nanosecond, most + time.Second, math.MaxInt64} {
		if err := lease.Extend(ctx, ttl); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("Extend(%v) = %v; want fence.ErrInvalidOption", ttl, err)
		}
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("after the refused Extends the lease has ended: %v", err)
	}
	if got := leaseID(t, lease); got != id || !lease.Deadline().Equal(dl) {
		t.Errorf("after the refused Extends: etcd lease %x (was %x), deadline %v (was %v)", got, id, lease.Deadline(), dl)
	}
	if r, err := admin.TimeToLive(ctx, id); err != nil || r.TTL <= 0 {
		t.Fatalf("after the refused Extends the etcd lease is gone: %+v, %v", r, err)
	}
	if err := lease.Extend(ctx, most); err != nil {
		t.Fatalf("Extend(%v), etcd's maximum = %v", most, err)
	}
	if left := time.Until(lease.Deadline()); left < most-most/100-time.Minute { // (deadline allows 1% clock drift)
		t.Errorf("Extend(%v): deadline %v away", most, left)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := etcdlock.New(admin, &etcdlock.Options{WatchdogTTL: most}); err != nil {
		t.Errorf("New with WatchdogTTL %v (etcd's maximum) = %v", most, err)
	}
	if _, err := etcdlock.New(admin, &etcdlock.Options{WatchdogTTL: most + time.Nanosecond}); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("New with WatchdogTTL %v = %v; want fence.ErrInvalidOption", most+time.Nanosecond, err)
	}
}
