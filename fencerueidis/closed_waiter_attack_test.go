package fencerueidis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// TestClientClosedUnderWaiter: the rueidis client is closed while an
// Acquire waits (20 s budget) on a lock held for a minute by another
// process. The waiter must return within seconds with an error matching
// fence.ErrClosed (as on go-redis, where a closed client ends the wait),
// not wait out its budget, and leave no goroutine behind (TestMain's
// goleak check).
func TestClientClosedUnderWaiter(t *testing.T) {
	for _, tc := range []string{"resp3", "resp2", "resp2-killed", "go-redis"} {
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
				c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, AlwaysRESP2: resp2, DisableCache: resp2})
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
