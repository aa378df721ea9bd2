package redislock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestStatusForUserWithoutEval: an ACL user allowed EVALSHA but not EVAL
// (-eval: scripts loaded by an administrator, run by their SHA only) takes
// locks while the server has fence's scripts cached, and Status read the
// lock by EVALSHA as long as state.lua was cached too. Since Status sends
// its scripts by EVAL only (so that a primary pausing writes runs them even
// uncached), it fails for that user whatever the cache holds: "NOPERM this
// user has no permissions to run the 'eval' command" (with state.lua sent
// by SHA, as before, the test passes). Falling back to
// EVALSHA on NOPERM would cost nothing on the common path; fence doctor
// reports EVAL as required (command-denied), so whether such a user is
// supported at all is the question.
func TestStatusForUserWithoutEval(t *testing.T) {
	t.Skip("design question: is an ACL user allowed EVALSHA but not EVAL supported (Status sends EVAL only since it must run uncached during a write pause)?")
	srv := redistest.Start(t)
	admin := srv.Client(t)
	// The administrator's Locker loads every script: its acquisition,
	// release and Status run them in full the first time.
	al := newLockerWith(t, admin, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:status-evalsha-only"
	acquire(t, al, name+":load", fence.TTL(time.Minute))
	if _, err := al.Status(ctx(t), name); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-eval").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	l := newLockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	st, err := l.Status(ctx(t), name)
	if err != nil || !st.Held || st.LastToken != lease.Token() {
		t.Fatalf("Status for a user allowed EVALSHA only, scripts cached = %+v, %v; want held, token %d", st, err, lease.Token())
	}
}
