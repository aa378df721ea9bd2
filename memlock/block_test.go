package memlock_test

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// blockOnce is an Observer whose first LeaseEnded blocks until released.
type blockOnce struct {
	fence.NopObserver
	first   atomic.Bool
	blocked chan struct{}
	let     chan struct{}
}

func (b *blockOnce) LeaseEnded(fence.LeaseEvent) {
	if b.first.CompareAndSwap(false, true) {
		close(b.blocked)
		<-b.let
	}
}

// An Observer that blocks in LeaseEnded (against its contract: it should
// be quick) holds up only the goroutine that reports: here the expired
// lease's timer. The Locker goes on: the expired lock is taken again, and
// other locks are taken and released.
func TestBlockingObserverHoldsUpOnlyItsGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &blockOnce{blocked: make(chan struct{}), let: make(chan struct{})}
		l, err := memlock.New(&memlock.Options{WatchdogTTL: time.Second, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		a := mustAcquire(t, l, "a", fence.TTL(time.Second))
		<-obs.blocked // a's timer is reporting its expiry, and blocked
		if !isDone(a) {
			t.Fatal("the expired lease is not done while its end is reported")
		}
		again := mustAcquire(t, l, "a")
		other := mustAcquire(t, l, "b", fence.TTL(time.Minute))
		mustRelease(t, other)
		mustRelease(t, again)
		close(obs.let)
	})
}
