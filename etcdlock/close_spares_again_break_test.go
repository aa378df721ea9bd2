package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Locker.Close with a ctx that had ended took the etcd leases kept for
// reuse off the Locker, failed to revoke them ("revoke …: context
// canceled") and forgot them: the Close called again, with time to
// revoke, returned nil and revoked nothing, and the etcd lease was still
// on etcd with its whole TTL ("TTL 29") until it expired. Close may be
// called again, and does what the first could not: a spare whose revoke
// failed stays on the Locker for it.
func TestCloseAgainRevokesSpares(t *testing.T) {
	l := newLocker(t, shared.Endpoints(), nil)
	admin := newClient(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), 30*time.Second)
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	ids := l.SpareIDs()
	if len(ids) != 1 {
		t.Fatalf("%d etcd leases kept after a Release, want 1", len(ids))
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Close(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("Locker.Close with a ctx ended, a spare kept = %v, want ctx's error", err)
	}
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("Locker.Close again = %v", err)
	}
	ttl, err := admin.TimeToLive(ctxFor(t, 10*time.Second), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the spare etcd lease after Close, then Close again: TTL %d", ttl.TTL)
	if ttl.TTL != -1 {
		t.Errorf("the spare etcd lease is still on etcd after Close, then Close again (TTL %d s)", ttl.TTL)
	}
}
