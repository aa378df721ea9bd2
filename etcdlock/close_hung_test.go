package etcdlock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
)

// Close revokes the etcd leases kept for reuse. With one member of three
// hung (paused: its connection open, nothing answered) the cluster serves,
// and every call of the Locker gets a timeout per attempt and tries the
// next member; Close sent its revokes with the caller's ctx alone, so one
// that the balancer sent to the hung member waited for ctx's end (here
// 10 s, for ever without a deadline) and Close failed on a healthy
// cluster.
func TestCloseWithHungMember(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	l := newLocker(t, c.Endpoints(), &etcdlock.Options{WatchdogTTL: 3 * time.Second})
	// Six etcd leases kept for reuse: held at once, then released.
	var leases []fence.Lease
	for i := range 6 {
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), "close-hung-"+string(rune('a'+i)))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	for _, lease := range leases {
		if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	leader := etcdtest.Leader(t, c)
	hung := c.Members[0]
	if hung == leader {
		hung = c.Members[1]
	}
	hung.Stop()
	t.Cleanup(hung.Cont)
	start := time.Now()
	err := l.Close(ctxFor(t, 10*time.Second))
	t.Logf("Close with member %s hung = %v after %v", hung.Name, err, time.Since(start))
	if err != nil {
		t.Fatalf("Close on a cluster that serves, one member hung = %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v", took)
	}
}
