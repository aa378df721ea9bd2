package etcdlock_test

import (
	"testing"
	"time"
)

// Two Locker.Closes at once (a shutdown hook and a deferred Close), the
// member hanging: the first took the etcd lease kept for reuse off the
// Locker and was revoking it; the second found nothing to wait for and
// returned nil at once. Its caller then closed the client, which cut the
// first Close's revoke, and the etcd lease stayed on etcd with its whole
// TTL ("TTL 29") until it expired. A Close called while another is under
// way must not return before it, within its ctx.
func TestConcurrentCloseWaitsForSpares(t *testing.T) {
	l, c, g, rc := revokeCutLocker(t)
	admin := newClient(t, shared.Endpoints(), nil)
	spare := keepSpare(t, l)
	g.hang()
	first := make(chan error, 1)
	go func() { first <- l.Close(ctxFor(t, 20*time.Second)) }()
	waitCount(t, &rc.sent, 1, "revokes sent")
	second := make(chan error, 1)
	go func() {
		err := l.Close(ctxFor(t, 20*time.Second))
		_ = c.Close()
		second <- err
	}()
	// The first Close's revoke is cut after its attempt timeout (5 s);
	// the member answers its next attempt.
	waitCount(t, &rc.cut, 1, "revokes cut")
	g.resume()
	for i, closed := range []chan error{first, second} {
		select {
		case err := <-closed:
			t.Logf("Close %d = %v", i+1, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("Close %d still waiting 10 s after the member answered", i+1)
		}
	}
	wantSpareRevoked(t, admin, spare, "both Closes")
}
