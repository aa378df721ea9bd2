package redislock_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
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
	pauseWrites(t, admin) // its Cleanup runs before acquire's, so the Release can run
	statusHeld(t, l, name, lease, "Status during a write pause")
}

// TestFirstStatusDuringWritePause: the same read on a server that has never
// run state.lua: a primary just promoted (scripts are not replicated, the
// new primary's cache is empty) or just restarted, which is when an
// operator runs fence status. Redis cannot read the flags of a SHA it does
// not know, so it held back the EVALSHA for the whole pause, and Status of
// a held lease failed at its deadline (on go-redis: "context deadline
// exceeded" after 2 s); sent by EVAL, the script's no-writes flag is read
// from its source and it runs at once.
func TestFirstStatusDuringWritePause(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	l := newLockerWith(t, admin, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:first-status-writepause"
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	if err := admin.Do(ctx(t), "SCRIPT", "FLUSH").Err(); err != nil { // as a promoted replica's
		t.Fatal(err)
	}
	pauseWrites(t, admin)
	st := statusHeld(t, l, name, lease, "first Status during a write pause")
	if st.ReplicasErr != nil {
		t.Fatalf("first Status during a write pause: replicas unknown: %v", st.ReplicasErr)
	}
}

// TestFirstStatusDuringWritePauseWrapped: the same read through a user's
// own client type (a struct embedding redis.UniversalClient), whose Locker asks
// the server, before it reads replica counts, whether the client hides a
// cluster or a Ring: a probe script per key, which declared no flags and
// was held back for the whole pause. The lock was read, but Status ran to
// the caller's 2 s deadline (2.15 s) and gave no counts (ReplicasErr:
// "redislock: stopped waiting for the reply: context deadline exceeded").
func TestFirstStatusDuringWritePauseWrapped(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:first-status-writepause-wrapped"
	lease := acquire(t, newLockerWith(t, admin, redislock.Options{}), name, fence.TTL(time.Minute))
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	l := newLockerWith(t, interfaceWrapped{c}, redislock.Options{}) // replica sync on: it probes
	pauseWrites(t, admin)
	st := statusHeld(t, l, name, lease, "first Status during a write pause, wrapped client")
	if st.ReplicasErr != nil {
		t.Fatalf("first Status during a write pause, wrapped client: replicas unknown: %v", st.ReplicasErr)
	}
}

// TestStatusDuringWritePauseBehindBatches: Status during a write pause
// while three other calls of the Locker, writes, wait out the pause: one
// went straight through and two in the two batches a Locker sends at once
// (batch.go). Status found the batches' senders busy and queued for the
// next batch, which was to go once one of them had its replies: after
// the pause. It failed at its 2 s deadline ("redislock: batched call
// never sent: context deadline exceeded").
func TestStatusDuringWritePauseBehindBatches(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	l := newLockerWith(t, srv.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:status-writepause-batches"
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	if err := admin.Do(ctx(t), "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	const held = 3
	done := make(chan error, held)
	actx := ctx(t) // ends after the Cleanup below
	t.Cleanup(func() {
		_ = admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err()
		for range held {
			if err := <-done; err != nil {
				t.Errorf("an Acquire held back by the pause: %v", err)
			}
		}
	})
	for i := range held {
		go func() {
			other, err := l.Acquire(actx, fmt.Sprintf("%s:other%d", name, i), fence.TTL(time.Minute))
			if err == nil {
				err = other.Release(actx)
			}
			done <- err
		}()
		// One at a time: each takes the next way out (straight, then a
		// batch of its own).
		waitFor(t, func() bool {
			return strings.Contains(admin.Info(ctx(t), "clients").Val(), fmt.Sprintf("blocked_clients:%d\r", i+1))
		})
	}
	statusHeld(t, l, name, lease, "Status during a write pause, behind paused writes")
}

// TestStatusDuringWritePauseAutoPipeliner: the same on go-redis's
// AutoPipeliner (replica sync off, as New requires of one): Status's
// script went in the AutoPipeliner's next batch, which waits for the batch
// in flight, whose write the pause held, and Status failed at its 2 s
// deadline ("redislock: stopped waiting for the reply: context deadline
// exceeded").
func TestStatusDuringWritePauseAutoPipeliner(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ap, err := srv.Client(t).AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ap.Close() })
	l := newLockerWith(t, ap, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "lock:status-writepause-autopipeliner"
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	if err := admin.Do(ctx(t), "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	actx := ctx(t) // ends after the Cleanup below
	t.Cleanup(func() {
		_ = admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err()
		if err := <-done; err != nil {
			t.Errorf("the Acquire held back by the pause: %v", err)
		}
	})
	go func() {
		other, err := l.Acquire(actx, name+":other", fence.TTL(time.Minute))
		if err == nil {
			err = other.Release(actx)
		}
		done <- err
	}()
	waitFor(t, func() bool {
		return strings.Contains(admin.Info(ctx(t), "clients").Val(), "blocked_clients:1\r")
	})
	statusHeld(t, l, name, lease, "Status during a write pause, AutoPipeliner")
}

// pauseWrites pauses the server's writes (CLIENT PAUSE WRITE, as a
// switchover does) until the test ends.
func pauseWrites(t *testing.T, admin *redis.Client) {
	t.Helper()
	if err := admin.Do(ctx(t), "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err() })
}

// statusHeld reads name's Status within 2 s and fails the test, saying
// what was read, unless it is lease, held.
func statusHeld(t *testing.T, l *redislock.Locker, name string, lease fence.Lease, what string) redislock.Status {
	t.Helper()
	c, cancel := context.WithTimeout(ctx(t), 2*time.Second)
	defer cancel()
	st, err := l.Status(c, name)
	if err != nil || !st.Held || st.LastToken != lease.Token() {
		t.Fatalf("%s = %+v, %v; want held, token %d", what, st, err, lease.Token())
	}
	return st
}
