package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
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
	spare := keepSpare(t, l)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Close(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("Locker.Close with a ctx ended, a spare kept = %v, want ctx's error", err)
	}
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("Locker.Close again = %v", err)
	}
	wantSpareRevoked(t, admin, spare, "Close, then Close again")
}

// keepSpare acquires a lease of 30 s on l and releases it, and returns
// the etcd lease l then keeps for reuse, failing the test unless it keeps
// that one alone.
func keepSpare(t *testing.T, l *etcdlock.Locker) clientv3.LeaseID {
	t.Helper()
	lease := acquire(t, l, t.Name(), 30*time.Second)
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	ids := l.SpareIDs()
	if len(ids) != 1 {
		t.Fatalf("%d etcd leases kept after a Release, want 1", len(ids))
	}
	return ids[0]
}

// wantSpareRevoked fails the test unless etcd no longer knows the etcd
// lease spare after the Closes that after names.
func wantSpareRevoked(t *testing.T, admin *clientv3.Client, spare clientv3.LeaseID, after string) {
	t.Helper()
	ttl, err := admin.TimeToLive(ctxFor(t, 10*time.Second), spare)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the spare etcd lease after %s: TTL %d", after, ttl.TTL)
	if ttl.TTL != -1 {
		t.Errorf("the spare etcd lease is still on etcd after %s (TTL %d s)", after, ttl.TTL)
	}
}
