package redislock

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestTriedDuringOutageTriesAgain: a waiter whose try ran while its
// Locker's subscription was down (the grant that followed it was
// published to nobody) and that joins the subscription after it came
// back must try again at once: the wake-up of the resubscription came
// before it joined, and the subscription's first confirmation, long
// before its try, says nothing about what it missed. Otherwise it waits
// for the old holder's TTL while the lock, granted to it, sits idle.
func TestTriedDuringOutageTriesAgain(t *testing.T) {
	t.Parallel() // own server and Lockers; mostly waits on the resubscription
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "lock:outage"
	holders, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	held, err := holders.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c := srv.Client(t)
	gate := &dialGate{entered: make(chan struct{}, 1), release: make(chan struct{})}
	c.AddHook(gate)
	var wg sync.WaitGroup
	for range 3 { // pooled connections for the try and the release
		wg.Go(func() {
			if err := c.BLPop(ctx, 50*time.Millisecond, "no-such-list").Err(); err != nil && err != redis.Nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	l, err := New(c, &Options{ReplicaSync: ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	k := l.keys(name)
	// Another waiter of this Locker keeps the subscription up.
	other, _, leaveOther, err := l.join(ctx, k.channel, "00000000000000000000000000000000")
	if err != nil {
		t.Fatal(err)
	}
	defer leaveOther()

	gate.armed.Store(true)
	if err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	<-gate.entered // the subscription is down, reconnecting
	l.mu.Lock()
	sub := l.subscriptions[k.channel]
	l.mu.Unlock()

	a := l.newAttempt(name, time.Minute)
	a.acquireArgs[3], a.acquireArgs[4] = l.waitArg.get(20*time.Second), 1
	tried := time.Now()
	if ls, _, err := l.try(ctx, a); ls != nil || err != nil {
		t.Fatalf("try = %v, %v; want held", ls, err)
	}
	if err := held.Release(ctx); err != nil { // grants a; published to nobody
		t.Fatal(err)
	}
	close(gate.release)
	// Subscribed again, and the reader has read the confirmation: a grant
	// to nobody published after it has reached the subscription.
	marker := "g 11111111111111111111111111111111 1 1 1 0 x"
	l.expectJoin("11111111111111111111111111111111") // kept: see subscription.recent
	defer l.joined("11111111111111111111111111111111")
	eventually(t, func() bool {
		admin.Publish(ctx, k.channel, marker)
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, g := range sub.recent {
			if g.owner == "11111111111111111111111111111111" {
				return true
			}
		}
		return false
	})
	_ = other
	_, readyAt, leave, err := l.join(ctx, k.channel, a.owner)
	if err != nil {
		t.Fatal(err)
	}
	defer leave()
	if readyAt.Before(tried) {
		t.Errorf("joined after the resubscription, the waiter is told the subscription was up since %v, before its try at %v: it would wait for the old holder's TTL", readyAt.Format("15:04:05.000"), tried.Format("15:04:05.000"))
	}
	if _, err := l.releaseOwned(ctx, a, -1, true); err != nil {
		t.Fatal(err)
	}
}
