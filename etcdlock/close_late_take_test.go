package etcdlock_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// TestCloseDuringLateTake: an Acquire with a wait budget whose create Txn
// took the lock but answered past the lease's deadline gives that take
// back and tries again on a new etcd lease (TestLateTake); when the Locker
// was closed meanwhile, it must not: the new etcd lease and key would be
// work that Close did not wait for, and the lease a Locker closed before
// it was granted.
//
// It failed: Close returned nil at once, and Acquire returned a lease
// (token 4) 1.03 s after it.
func TestCloseDuringLateTake(t *testing.T) {
	const ttl = time.Second
	var delays atomic.Int64
	l, err := etcdlock.New(delayingClient(t, shared.Endpoints(), &delays, ttl), nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, shared.Endpoints(), nil)
	pfx := l.Prefix(t.Name())
	delays.Store(1)
	type result struct {
		lease fence.Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctxFor(t, 30*time.Second), t.Name(), fence.TTL(ttl), fence.Wait(10*time.Second))
		done <- result{lease, err}
	}()
	// The create Txn was applied; its reply is held for the lease time.
	for end := time.Now().Add(10 * time.Second); countKeys(t, admin, pfx) == 0; {
		if time.Now().After(end) {
			t.Fatal("no key created after 10 s")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	if err := l.Close(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	r := <-done
	t.Logf("Acquire: %v, %v after Close returned", r.err, time.Since(closed).Round(time.Millisecond))
	if r.lease != nil {
		defer r.lease.Release(ctxFor(t, 5*time.Second)) //nolint:errcheck // the verdict is that there was a lease
		t.Fatalf("Acquire under way at Close returned a lease (token %d) after Close returned", r.lease.Token())
	}
	if !errors.Is(r.err, fence.ErrNotAcquired) || !errors.Is(r.err, fence.ErrClosed) {
		t.Errorf("Acquire = %v, want ErrNotAcquired and ErrClosed", r.err)
	}
	if n := countKeys(t, admin, pfx); n != 0 {
		t.Errorf("%d key(s) left after the Acquire returned", n)
	}
}
