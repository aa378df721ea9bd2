package zklock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// TestEndedLeaseLeavesNoNode: Extend sends only a read (Exists), so a
// renewal whose reply is lost or late changes nothing on the server, and a
// lease with fence.TTL that Extend failed to move ends at its deadline with
// its node deleted by the holder, without Release: nothing lingers for a
// later TTL or for the session's life. A deferred Release then returns the
// lease's error.
func TestEndedLeaseLeavesNoNode(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	l, conn := newLocker(t, addrs)
	const name = "ended-lease-node"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, name, fence.TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	gone, stop := context.WithCancel(ctx)
	stop()
	if err := lease.Extend(gone, 30*time.Second); err == nil {
		t.Fatal("Extend with a done ctx returned nil")
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	end := time.Now().Add(sessionTimeout)
	for len(lockNodes(t, conn, name)) != 0 {
		if time.Now().After(end) {
			t.Fatalf("nodes %v left a session timeout after the lease ended, session alive", lockNodes(t, conn, name))
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	if err := lease.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of the ended lease = %v, want ErrLeaseLost", err)
	}
}
