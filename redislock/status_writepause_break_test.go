package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// TestStatusDuringWritePause: Status reads the lock on a primary whose
// writes are paused (CLIENT PAUSE WRITE: an operator's controlled
// switchover, or the old primary during a FAILOVER), as it does on one
// that refuses writes (TestStatusOnPrimaryRefusingWrites). Redis holds
// back, for the whole pause, every script that does not declare itself
// free of writes, and state.lua declared nothing: Status of a held lease
// failed with "context deadline exceeded" at the caller's 2 s deadline,
// where the PTTL and GET it sent before state.lua answered at once.
//
// The Status before the pause loads the script on the server: an EVALSHA
// of a script the server does not have is held back too, whatever its
// flags (Redis cannot read them), and so is the first Status on a server
// that has never run state.lua.
func TestStatusDuringWritePause(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	l := newLockerWith(t, admin, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:status-writepause"
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	if _, err := l.Status(ctx(t), name); err != nil { // loads state.lua
		t.Fatal(err)
	}
	if err := admin.Do(ctx(t), "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	// Registered after acquire's: runs first, so the Release can run.
	t.Cleanup(func() { _ = admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err() })
	c, cancel := context.WithTimeout(ctx(t), 2*time.Second)
	defer cancel()
	st, err := l.Status(c, name)
	if err != nil || !st.Held || st.LastToken != lease.Token() {
		t.Fatalf("Status during a write pause = %+v, %v; want held, token %d", st, err, lease.Token())
	}
}
