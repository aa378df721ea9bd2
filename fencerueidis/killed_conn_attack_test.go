package fencerueidis_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// TestCallsAfterConnectionsKilled: the client's connections are killed
// (CLIENT KILL, as a restart, a failover or a proxy does) just before a
// Release, an Extend or an Acquire. On go-redis, which sends a command
// again on a connection found broken, each succeeds; on rueidis, whose
// non-idempotent commands are not sent again, the call failed with EOF
// and a Release left the lock held by nobody for its lease time.
func TestCallsAfterConnectionsKilled(t *testing.T) {
	for _, tc := range []string{"rueidis", "go-redis"} {
		t.Run(tc, func(t *testing.T) {
			srv := redistest.Start(t)
			admin := srv.Client(t)
			var l *redislock.Locker
			if tc == "go-redis" {
				var err error
				if l, err = redislock.New(srv.Client(t), &redislock.Options{WatchdogTTL: watchdogTTL}); err != nil {
					t.Fatal(err)
				}
			} else {
				l = newLocker(t, client(t, srv.Addr), redislock.Options{})
			}
			kill := func() {
				t.Helper()
				if err := admin.Do(ctx(t), "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
					t.Fatal(err)
				}
			}
			failed := 0
			for i := range 20 {
				kill()
				lease, err := l.Acquire(ctx(t), "killed", fence.TTL(time.Minute))
				if err != nil {
					failed++
					t.Logf("round %d: Acquire: %v", i, err)
					continue
				}
				kill()
				if err := lease.Extend(ctx(t), time.Minute); err != nil {
					failed++
					t.Logf("round %d: Extend: %v", i, err)
				}
				kill()
				if err := lease.Release(ctx(t)); err != nil {
					failed++
					t.Logf("round %d: Release: %v", i, err)
					if err := lease.Release(ctx(t)); err != nil {
						t.Fatalf("round %d: Release again: %v", i, err)
					}
				}
			}
			if failed > 0 {
				t.Errorf("%d of 60 calls failed after the connections were killed", failed)
			}
		})
	}
}
