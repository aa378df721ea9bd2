package redislock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
)

// TestQueueOfQuittersStaysSmall: while one holder keeps the lock, waiters
// come with short budgets and give up. Each one's entry leaves the hash
// when it withdraws; its owner id must not stay in the queue list for
// ever either: a lock held for hours under a steady stream of quitters
// would grow the list without bound (and the release that finally comes
// would walk all of it in one script).
func TestQueueOfQuittersStaysSmall(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name, workers, each = "lock:quitters", 8, 40
	lock := lockKey(name)
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	// One patient waiter keeps the queue's keys alive meanwhile.
	patient := make(chan error, 1)
	go func() {
		ls, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		patient <- err
	}()
	waitFor(t, func() bool { return admin.HLen(ctx(t), lock+":waiters").Val() == 1 })
	var wg sync.WaitGroup
	for range workers {
		l := newLocker(t, srv.Client(t))
		wg.Go(func() {
			for range each {
				if _, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Millisecond), fence.TTL(time.Minute)); err == nil {
					t.Error("acquired a held lock")
				}
			}
		})
	}
	wg.Wait()
	waitFor(t, func() bool { return admin.HLen(ctx(t), lock+":waiters").Val() == 1 })
	t.Logf("queue %d", admin.LLen(ctx(t), lock+":queue").Val())
	if n := admin.LLen(ctx(t), lock+":queue").Val(); n > 2*workers+16 {
		t.Errorf("after %d quitters (one waiter left) the queue list holds %d owners", workers*each, n)
	}
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-patient; err != nil {
		t.Fatalf("the patient waiter: %v", err)
	}
}
