package redislock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// A Release whose script ran but whose reply was lost with its connection
// (the package doc, Deadlines). go-redis sends the script again on a fresh
// connection (MaxRetries, 3 by default), and that second run finds the
// lock gone: the Release reports a loss that did not happen, an error
// matching fence.ErrLeaseLost, with the lock free (documented, as the cost
// of go-redis's resend). With MaxRetries -1 the Release returns the
// connection's error instead, and Release again returns nil (fence.Lease's
// Release: a retry that finds the lock gone). Found 2026-12-06: the false
// loss was suspected, not shown, until this test.
func TestReleaseReplyLostWithConnection(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	for _, retries := range []int{0, -1} { // 0: go-redis's default, 3
		const name = "lock:release-reply-lost"
		d := redistest.NewDropper(name)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: d.Dial, MaxRetries: retries})
		t.Cleanup(func() { _ = c.Close() })
		l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
		// Once first, so that the release script is loaded: an EVALSHA
		// refused with NOSCRIPT has not run.
		if err := acquire(t, l, name, fence.TTL(time.Minute)).Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
		lease := acquire(t, l, name, fence.TTL(time.Minute))
		d.Arm()
		err := lease.Release(ctx(t))
		if d.Dropped() != 1 {
			t.Fatalf("MaxRetries %d: %d replies dropped, want the release's", retries, d.Dropped())
		}
		if n := admin.Exists(ctx(t), lockKey(name)).Val(); n != 0 {
			t.Fatalf("MaxRetries %d: the lock is still there after the Release (%v)", retries, err)
		}
		if retries == 0 {
			if !errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("Release sent again by go-redis = %v; the package doc says an error matching fence.ErrLeaseLost", err)
			}
			continue
		}
		if err == nil || errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release with MaxRetries -1, its reply lost = %v, want the connection's error", err)
		}
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatalf("Release again, after the one whose reply was lost = %v, want nil", err)
		}
	}
}
