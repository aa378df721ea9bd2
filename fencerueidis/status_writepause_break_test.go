package fencerueidis_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// TestFirstStatusDuringWritePause: as redislock's, over rueidis: Status on
// a server that has never run state.lua (a primary just promoted or
// restarted), while its writes are paused (a switchover), answers at once.
// The EVALSHA of a SHA the server does not know was held back for the
// whole pause, its flags unknown, and Status failed at its deadline.
func TestFirstStatusDuringWritePause(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	l := newLocker(t, client(t, srv.Addr), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:first-status-writepause"
	lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx(t), "SCRIPT", "FLUSH").Err(); err != nil { // as a promoted replica's
		t.Fatal(err)
	}
	if err := admin.Do(ctx(t), "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	// Registered after the Locker's: runs first, so that it can close.
	t.Cleanup(func() { _ = admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err() })
	c, cancel := context.WithTimeout(ctx(t), 2*time.Second)
	defer cancel()
	st, err := l.Status(c, name)
	if err != nil || !st.Held || st.LastToken != lease.Token() {
		t.Fatalf("first Status during a write pause = %+v, %v; want held, token %d", st, err, lease.Token())
	}
}
