package fencerueidis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// TestClosedAfterTimeout: TestClosedClient after one call timed out on a
// stopped server. A Locker whose rueidis client was closed must grant no
// lease and take no lock: every call fails with an error matching
// fence.ErrClosed, as it does on a client closed without a timeout first.
//
// It failed, about two runs in three: the Acquire after Close was granted
// a lease and took the lock, and the Locker's parked give-back goroutine
// then retried for the lease time (goleak). The call the deadline left
// (redislock's call goroutine, reconnecting) dials while Close runs, and
// rueidis v1.0.79 and v1.0.80 store the new connection over the closed
// client's dead one (mux._pipe: Store, not CompareAndSwap from init), so
// the closed client works again for good; a bare c.Do after such a Close
// gets the server's reply. The adapter now reads the flag the client's
// Close sets (stopFlag) and refuses every call after it.
func TestClosedAfterTimeout(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	c := client(t, srv.Addr)
	l := newLocker(t, c, redislock.Options{})
	resume := srv.Pause(t)
	dctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := l.Acquire(dctx, "before", fence.TTL(time.Minute))
	cancel()
	t.Logf("Acquire on the stopped server: %v", err)
	resume()
	c.Close()
	for i := range 3 {
		lease, err := l.Acquire(ctx(t), "after-close", fence.TTL(time.Minute))
		if err == nil {
			t.Fatalf("try %d: Acquire on a closed client granted token %d (the lock on the server: %d)", i, lease.Token(), admin.Exists(ctx(t), lockKey("after-close")).Val())
		}
		t.Logf("try %d: %v", i, err)
		if !errors.Is(err, fence.ErrClosed) {
			t.Errorf("try %d: Acquire on a closed client = %v, want fence.ErrClosed", i, err)
		}
	}
	if n := admin.Exists(ctx(t), lockKey("after-close")).Val(); n != 0 {
		t.Fatal("a Locker on a closed client took the lock")
	}
}
