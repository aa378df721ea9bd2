package etcdlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fencekit/fence/etcdlock"
)

// A Close whose ctx had ended already (a deferred Close with a request's
// ctx, say) rightly returned at once, saying an Extend was still settling,
// but it also stopped revokes from being retried in the background, as a
// Close does once it has waited for the settles: the settle, giving up
// later (the member hung), could not leave the revoke of the lease's etcd
// lease, which holds the key, to be retried. The Close called again, with
// time to wait, waited for the settle, found no revoke to wait for and
// returned nil; the user's close of the client then left the key holding
// the lock for nobody until its etcd lease expired (30 s here: "1 keys
// still under ... 5s later"). Close may be called again, and waits for
// what is under way then: one that gave up before the settles were through
// must leave their revokes to be retried, for the next Close to wait for.
func TestCloseAgainWaitsForSettlesRevoke(t *testing.T) {
	closeDuringSettle(t, "Locker.Close again", func(l *etcdlock.Locker) {
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		err := l.Close(ended)
		t.Logf("Locker.Close with a ctx ended = %v", err)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Locker.Close with a ctx ended, an Extend settling = %v, want ctx's error", err)
		}
	})
}
