package fencerueidis_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// TestSubscriptionsEndWithWaiters: once the last waiter on a lock name
// leaves, the Locker's subscription to its release channel ends on the
// server too, as on go-redis (whose PubSub.Close unsubscribes). rueidis's
// Receive returns at its ctx's end without unsubscribing: on RESP3 every
// lock name ever waited on stayed subscribed on the client's connection
// for its life, and each release of it was delivered to the client.
func TestSubscriptionsEndWithWaiters(t *testing.T) {
	for _, tc := range []string{"resp3", "resp2", "go-redis"} {
		t.Run(tc, func(t *testing.T) {
			srv := redistest.Start(t)
			admin := srv.Client(t)
			g, err := redislock.New(admin, nil)
			if err != nil {
				t.Fatal(err)
			}
			var l *redislock.Locker
			if tc == "go-redis" {
				if l, err = redislock.New(srv.Client(t), &redislock.Options{WatchdogTTL: watchdogTTL}); err != nil {
					t.Fatal(err)
				}
			} else {
				resp2 := tc == "resp2"
				c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, AlwaysRESP2: resp2, DisableCache: resp2})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(c.Close)
				l = newLocker(t, c, redislock.Options{})
			}
			const n = 5
			for i := range n {
				name := fmt.Sprintf("payment:%d", i)
				held, err := g.Acquire(ctx(t), name, fence.TTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				got := make(chan error, 1)
				go func() {
					lease, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
					if err == nil {
						err = lease.Release(ctx(t))
					}
					got <- err
				}()
				ch := lockKey(name) + ":released"
				waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1 })
				if err := held.Release(ctx(t)); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatal(err)
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				chans := admin.PubSubChannels(ctx(t), "*").Val()
				if len(chans) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("5 s after the last waiter of %d names left, still subscribed to %d channels: %v", n, len(chans), chans)
				}
				time.Sleep(20 * time.Millisecond) // polling with a deadline
			}
		})
	}
}

// TestHungServerSubscribedWaiter: a waiter subscribed (RESP3 on the shared
// connection, RESP2 on a dedicated one with its close watch) when the
// server stops (SIGSTOP) returns by its caller's deadline, and leaves no
// goroutine behind once the server resumes (TestMain's goleak check).
func TestHungServerSubscribedWaiter(t *testing.T) {
	for _, resp2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "resp3", true: "resp2"}[resp2], func(t *testing.T) {
			srv := redistest.Start(t)
			admin := srv.Client(t)
			g, err := redislock.New(admin, nil)
			if err != nil {
				t.Fatal(err)
			}
			const name = "hung-waiter"
			held, err := g.Acquire(ctx(t), name, fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, AlwaysRESP2: resp2, DisableCache: resp2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			l := newLocker(t, c, redislock.Options{})
			dctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			got := make(chan error, 1)
			go func() {
				_, err := l.Acquire(dctx, name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
				got <- err
			}()
			ch := lockKey(name) + ":released"
			waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1 })
			resume := srv.Pause(t)
			select {
			case err := <-got:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("waiter = %v, want context.DeadlineExceeded", err)
				}
			case <-time.After(5 * time.Second):
				t.Error("the waiter did not return within 2 s of its deadline on a stopped server")
			}
			resume()
			if err := held.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] == 0 })
		})
	}
}

// TestUnsubscribeSparesOtherLocker: two Lockers on one rueidis client wait
// on the same name (one subscription each on the shared connection). When
// the first one's waiter leaves, the adapter's UNSUBSCRIBE ends the
// channel's subscription for both; the second Locker's waiter must still
// be woken by the holder's release within seconds, not wait out the
// holder's minute-long TTL.
func TestUnsubscribeSparesOtherLocker(t *testing.T) {
	for _, resp2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "resp3", true: "resp2"}[resp2], func(t *testing.T) {
			srv := redistest.Start(t)
			admin := srv.Client(t)
			g, err := redislock.New(admin, nil)
			if err != nil {
				t.Fatal(err)
			}
			const name = "shared"
			held, err := g.Acquire(ctx(t), name, fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, AlwaysRESP2: resp2, DisableCache: resp2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			l1, l2 := newLocker(t, c, redislock.Options{}), newLocker(t, c, redislock.Options{})
			ch := lockKey(name) + ":released"
			subs := func() int64 { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] }
			c1, cancel1 := context.WithCancel(context.Background())
			defer cancel1()
			left := make(chan error, 1)
			go func() { _, err := l1.Acquire(c1, name, fence.Wait(20*time.Second)); left <- err }()
			waitFor(t, func() bool { return subs() >= 1 })
			got := make(chan error, 1)
			go func() {
				lease, err := l2.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
				if err == nil {
					err = lease.Release(ctx(t))
				}
				got <- err
			}()
			// Both subscribed: on RESP3 one connection counts once.
			waitFor(t, func() bool {
				return admin.HLen(ctx(t), lockKey(name)+":waiters").Val() == 2
			})
			cancel1()
			if err := <-left; err == nil {
				t.Fatal("the cancelled waiter acquired")
			}
			// The first Locker's UNSUBSCRIBE is sent and the second has
			// subscribed again, or never lost it.
			waitFor(t, func() bool { return subs() >= 1 })
			start := time.Now()
			if err := held.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("woken %v after the release", time.Since(start).Round(time.Millisecond))
			case <-time.After(10 * time.Second):
				t.Fatal("the second Locker's waiter was not woken 10 s after the release")
			}
		})
	}
}

// TestWaitersCancelledWhileSubscribing: waiters on one name cancelled at
// once, as their subscription is being made or torn down (50 of them, one
// after another): then a last waiter is still woken by the release within
// seconds, and once it leaves nothing stays subscribed. In "resp2-anchored"
// a waiter on another name waits throughout, so that the RESP2 waiters'
// shared connection stays up and each departure sends an UNSUBSCRIBE on it
// that the next waiter's SUBSCRIBE must follow, not precede. (It passed
// before the connection was shared, each name having its own; with the
// shared connection's UNSUBSCRIBE left out, the churned channel stayed
// subscribed: "condition not met within 30 s".)
func TestWaitersCancelledWhileSubscribing(t *testing.T) {
	for _, tc := range []string{"resp3", "resp2", "resp2-anchored"} {
		t.Run(tc, func(t *testing.T) {
			resp2 := tc != "resp3"
			srv := redistest.Start(t)
			admin := srv.Client(t)
			g, err := redislock.New(admin, nil)
			if err != nil {
				t.Fatal(err)
			}
			const name = "churn"
			held, err := g.Acquire(ctx(t), name, fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, AlwaysRESP2: resp2, DisableCache: resp2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			l := newLocker(t, c, redislock.Options{})
			if tc == "resp2-anchored" {
				const anchor = "anchor"
				held, err := g.Acquire(ctx(t), anchor, fence.TTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				actx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); _, _ = l.Acquire(actx, anchor, fence.Wait(time.Minute)) }()
				ch := lockKey(anchor) + ":released"
				waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1 })
				defer func() {
					cancel()
					<-done
					_ = held.Release(ctx(t))
					waitFor(t, func() bool { return len(admin.PubSubChannels(ctx(t), "*").Val()) == 0 })
				}()
			}
			for i := range 50 {
				cctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); _, _ = l.Acquire(cctx, name, fence.Wait(time.Minute)) }()
				if i%2 == 1 {
					runtime.Gosched()
				}
				cancel()
				<-done
			}
			got := make(chan error, 1)
			go func() {
				lease, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
				if err == nil {
					err = lease.Release(ctx(t))
				}
				got <- err
			}()
			ch := lockKey(name) + ":released"
			waitFor(t, func() bool {
				return admin.HLen(ctx(t), lockKey(name)+":waiters").Val() == 1 && admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1
			})
			if err := held.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the last waiter was not woken 10 s after the release")
			}
			if tc == "resp2-anchored" { // the anchor's subscription and its connection's close watch stay
				waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] == 0 })
			} else {
				waitFor(t, func() bool { return len(admin.PubSubChannels(ctx(t), "*").Val()) == 0 })
			}
		})
	}
}
