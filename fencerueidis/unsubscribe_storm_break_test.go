package fencerueidis_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// TestUnsubscribeBeforeConfirmation: an UNSUBSCRIBE of a lock's release
// channel answered on the client's connection after a waiter's SUBSCRIBE
// was registered but before it was confirmed (another Locker on the same
// client whose last waiter left, or this Locker's own late UNSUBSCRIBE)
// ends rueidis's Receive with no error. The waiter must subscribe again,
// not fail: it failed with "redislock: subscribe: fencerueidis:
// unsubscribed" (CI, TestSubscriptionKilled round 1). Here a goroutine
// sends that UNSUBSCRIBE over and over while the waiter waits; the waiter
// must get the lock once its holder releases.
func TestUnsubscribeBeforeConfirmation(t *testing.T) {
	for _, resp2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("resp2=%v", resp2), func(t *testing.T) {
			srv := redistest.Start(t)
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, AlwaysRESP2: resp2, DisableCache: resp2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			r := newLocker(t, c, redislock.Options{})
			g, err := redislock.New(srv.Client(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			for round := range 5 {
				held, err := g.Acquire(ctx(t), "shared", fence.TTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				stormCtx, stop := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				sent := make(chan struct{})
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; stormCtx.Err() == nil; i++ {
						_ = c.Do(stormCtx, c.B().Unsubscribe().Channel("fence:{shared}:released").Build()).Error()
						if i == 500 {
							close(sent)
						}
					}
				}()
				got := make(chan error, 1)
				var b fence.Lease
				go func() {
					var err error
					b, err = r.Acquire(ctx(t), "shared", fence.Wait(20*time.Second), fence.TTL(time.Minute))
					got <- err
				}()
				select {
				case <-sent:
				case err := <-got:
					stop()
					wg.Wait()
					t.Fatalf("round %d: the waiter returned while the lock was held: %v", round, err)
				case <-time.After(10 * time.Second):
					t.Fatal("the storm did not send 500 UNSUBSCRIBEs in 10 s")
				}
				if err := held.Release(ctx(t)); err != nil {
					t.Fatal(err)
				}
				select {
				case err = <-got:
				case <-time.After(15 * time.Second):
					err = fmt.Errorf("not woken 15 s after the release")
				}
				stop()
				wg.Wait()
				if err != nil {
					t.Fatalf("round %d: waiter under UNSUBSCRIBEs: %v", round, err)
				}
				if err := b.Release(ctx(t)); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
