package redislock_test

import (
	"context"
	"strings"
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
// lock by EVALSHA as long as state.lua was cached too. Status sends its
// scripts by EVAL only, so that a primary pausing writes runs them even
// uncached (TestFirstStatusDuringWritePause), and such a user is not
// supported: EVAL is required (README, the ACL paragraph; fence doctor
// reports it as command-denied), as every acquisition needs it once the
// script cache is emptied (a restart, a failover). Status says so at once,
// with the server's NOPERM naming eval, rather than read elsewhere.
func TestStatusForUserWithoutEval(t *testing.T) {
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
	acquire(t, l, name, fence.TTL(time.Minute)) // by EVALSHA: cached
	c2, cancel := context.WithTimeout(ctx(t), 5*time.Second)
	defer cancel()
	st, err := l.Status(c2, name)
	if err == nil || !strings.Contains(err.Error(), "NOPERM") || !strings.Contains(err.Error(), "eval") || c2.Err() != nil {
		t.Fatalf("Status for a user allowed EVALSHA only = %+v, %v; want NOPERM naming eval, at once", st, err)
	}
}
