package fencerueidis_test

import (
	"context"
	"strings"
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

// TestStatusDuringWritePauseBehindWrite: Status during a write pause while
// another call of the Locker, a write, waits out the pause: rueidis's
// automatic pipelining sent Status's script on the connection that carried
// the paused write, and Redis reads nothing more from a connection whose
// command it holds back, so Status failed at its deadline as if the
// script were held itself ("redislock: stopped waiting for the reply:
// context deadline exceeded" after 2 s).
func TestStatusDuringWritePauseBehindWrite(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	l := newLocker(t, client(t, srv.Addr), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:status-writepause-behind"
	lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	if err := admin.Do(ctx(t), "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	actx := ctx(t) // ends after the Cleanup below
	go func() {
		other, err := l.Acquire(actx, name+":other", fence.TTL(time.Minute))
		if err == nil {
			err = other.Release(actx)
		}
		done <- err
	}()
	// Registered last: runs first, so that the Acquire returns and the
	// lease can be released.
	t.Cleanup(func() {
		_ = admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err()
		if err := <-done; err != nil {
			t.Errorf("the Acquire held back by the pause: %v", err)
		}
	})
	waitFor(t, func() bool { // the Acquire's script is held back
		return strings.Contains(admin.Info(ctx(t), "clients").Val(), "blocked_clients:1\r")
	})
	c, cancel := context.WithTimeout(ctx(t), 2*time.Second)
	defer cancel()
	st, err := l.Status(c, name)
	if err != nil || !st.Held || st.LastToken != lease.Token() {
		t.Fatalf("Status during a write pause, behind a paused write = %+v, %v; want held, token %d", st, err, lease.Token())
	}
}
