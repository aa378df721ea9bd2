package redlock_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// A second Release given the lease's Context while the first is in flight:
// the first's end of the lease (as it started) must not make the second
// give up waiting for it with a spurious "context canceled"; it returns the
// first's result.
func TestConcurrentReleaseWithLeaseContext(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "detach-concurrent"
	rels := make([]*firstReleaseGate, len(srvs))
	hooks := make([]redis.Hook, len(srvs))
	for i := range srvs {
		rels[i] = newFirstReleaseGate()
		hooks[i] = rels[i]
	}
	cs := clientsWith(t, srvs, redis.Options{}, hooks...)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	ls, err := l.Acquire(ctxFor(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	lctx := ls.Context()
	for _, r := range rels {
		r.armed.Store(true)
	}
	first := make(chan error, 1)
	go func() { first <- ls.Release(ctxFor(t)) }()
	<-rels[0].held // the lease has ended; the deletes are held
	second := make(chan error, 1)
	go func() { second <- ls.Release(lctx) }()
	var early error
	returned := false
	select {
	case early = <-second:
		returned = true
	case <-time.After(100 * time.Millisecond):
	}
	for _, r := range rels {
		close(r.open)
	}
	if err := <-first; err != nil {
		t.Fatalf("first Release = %v", err)
	}
	if returned {
		t.Fatalf("second Release returned while the first was in flight: %v", early)
	}
	if err := <-second; err != nil {
		t.Errorf("second Release = %v, want the first's nil", err)
	}
}
