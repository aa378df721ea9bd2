package fencerueidis_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// TestClientClosedUnderWaiter: the rueidis client is closed while an
// Acquire waits (20 s budget) on a lock held for a minute by another
// process. The waiter must return within seconds with an error matching
// fence.ErrClosed (as on go-redis, where a closed client ends the wait),
// not wait out its budget, and leave no goroutine behind (TestMain's
// goleak check).
//
// In resp2-watch-killed-noretry the connection of the RESP2 waiters' close
// watch alone is killed first, on a client made with DisableRetry, whose
// Receive then returns EOF at once: the watch ended there, the shared
// connection went on unwatched, and the waiter still waited 5 s after
// Close (5 runs of 5; it returned when the holder released).
func TestClientClosedUnderWaiter(t *testing.T) {
	for _, tc := range []string{"resp3", "resp2", "resp2-killed", "resp2-watch-killed-noretry", "go-redis"} {
		t.Run(tc, func(t *testing.T) {
			srv := redistest.Start(t)
			admin := srv.Client(t)
			g, err := redislock.New(admin, nil)
			if err != nil {
				t.Fatal(err)
			}
			const name = "closed-waiter"
			held, err := g.Acquire(ctx(t), name, fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			var l *redislock.Locker
			var closeClient func()
			if tc == "go-redis" {
				gc := srv.Client(t)
				if l, err = redislock.New(gc, &redislock.Options{WatchdogTTL: watchdogTTL}); err != nil {
					t.Fatal(err)
				}
				closeClient = func() { _ = gc.Close() }
			} else {
				resp2 := tc != "resp3"
				c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, AlwaysRESP2: resp2, DisableCache: resp2,
					DisableRetry: tc == "resp2-watch-killed-noretry"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(c.Close)
				l, closeClient = newLocker(t, c, redislock.Options{}), c.Close
			}
			got := make(chan error, 1)
			go func() {
				_, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
				got <- err
			}()
			ch := lockKey(name) + ":released"
			waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1 })
			if tc == "resp2-killed" {
				// The subscription's and the close watch's
				// connections killed: the Locker subscribes again.
				killSubscribers(t, admin)
				waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1 })
			}
			if tc == "resp2-watch-killed-noretry" {
				// The close watch's connection alone killed, on a
				// client that does not retry: its Receive ends at once.
				waitFor(t, func() bool { return len(admin.PubSubChannels(ctx(t), "fencerueidis:closing:*").Val()) == 1 })
				killWatch(t, admin)
				waitFor(t, func() bool { return len(admin.PubSubChannels(ctx(t), "fencerueidis:closing:*").Val()) == 0 })
				if admin.PubSubNumSub(ctx(t), ch).Val()[ch] == 0 {
					t.Fatal("the waiters' shared connection was killed, not the close watch's")
				}
			}
			start := time.Now()
			closeClient()
			select {
			case err := <-got:
				t.Logf("waiter after Close: %v after %v", err, time.Since(start).Round(time.Millisecond))
				if !errors.Is(err, fence.ErrClosed) || !errors.Is(err, fence.ErrNotAcquired) {
					t.Errorf("waiter = %v, want ErrNotAcquired matching fence.ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("the waiter still waits 5 s after its client was closed")
				if err := held.Release(ctx(t)); err != nil {
					t.Fatal(err)
				}
				t.Logf("after the holder's release: %v", <-got)
			}
			_ = held.Release(ctx(t))
			waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] == 0 })
		})
	}
}

// killWatch kills the connection of the close watch of a RESP2 Locker's
// shared subscription connection: the subscribed connection dialed last
// (rueidis dials the shared connection's pub/sub connection before the
// watch's Receive dials the client's).
func killWatch(t *testing.T, admin *redis.Client) {
	t.Helper()
	last := -1
	for _, line := range strings.Split(strings.TrimSpace(admin.ClientList(ctx(t)).Val()), "\n") {
		id, subscribed := -1, false
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "id":
				id, _ = strconv.Atoi(v)
			case "sub":
				subscribed = v != "0"
			}
		}
		if subscribed && id > last {
			last = id
		}
	}
	if last < 0 {
		t.Fatal("no subscribed connection")
	}
	if err := admin.ClientKillByFilter(ctx(t), "ID", strconv.Itoa(last)).Err(); err != nil {
		t.Fatal(err)
	}
}
