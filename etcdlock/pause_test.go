package etcdlock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A paused (SIGSTOPped) leader: the others elect a new one, and the
// holder's watchdog renews through them.
func TestLeaderPaused(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	const ttl = 3 * time.Second
	l := newLocker(t, c.Endpoints(), &etcdlock.Options{WatchdogTTL: ttl})
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	// A waiter in line on a client of its own.
	granted := make(chan fence.Lease, 1)
	waitErr := make(chan error, 1)
	go func() {
		lease, err := newLocker(t, c.Endpoints(), &etcdlock.Options{WatchdogTTL: ttl}).Acquire(ctxFor(t, 60*time.Second), t.Name(), fence.Wait(40*time.Second))
		if err != nil {
			waitErr <- err
			return
		}
		granted <- lease
	}()
	admin := newClient(t, c.Endpoints(), nil)
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := admin.Get(ctxFor(t, 10*time.Second), l.Prefix(t.Name()), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err == nil && resp.Count == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiter not in line: %v", err)
		}
	}
	old := etcdtest.Leader(t, c)
	old.Stop()
	t.Cleanup(old.Cont)
	paused := time.Now()
	leader := etcdtest.Leader(t, c, old)
	t.Logf("leader %s paused; %s leads %v later", old.Name, leader.Name, time.Since(paused))
	// Three lease times later the lease still holds.
	select {
	case <-lease.Done():
		t.Fatalf("lease lost %v after the leader was paused: %v", time.Since(paused), lease.Err())
	case <-time.After(3 * ttl):
	}
	next, err := newLocker(t, c.Endpoints(), nil).Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.Wait(time.Second))
	if err == nil {
		t.Fatalf("acquired %d while %d held", next.Token(), lease.Token())
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	select {
	case w := <-granted:
		t.Logf("waiter granted %v after the release", time.Since(released))
		if w.Token() <= lease.Token() {
			t.Fatalf("waiter's token %d, want > %d", w.Token(), lease.Token())
		}
		if err := w.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	case err := <-waitErr:
		t.Fatalf("waiter: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the release did not wake the waiter within 10 s")
	}
}
