package fencerueidis_test

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// TestReleaseReplyLostWithConnection: a Release whose script ran but whose
// reply was lost with its connection. rueidis does not send the script
// again; the adapter does (connLost), as go-redis does, and that second
// run finds the lock gone. With the released-by record (release.lua) the
// Release returns nil, as on go-redis; taken out of the script, it
// returns "fence: lease lost: ... was removed or taken by another owner"
// though the lock was released.
func TestReleaseReplyLostWithConnection(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "release-reply-lost"
	d := redistest.NewDropper(lockKey(name))
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr},
		DialCtxFn: func(ctx context.Context, addr string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
			return d.Dial(ctx, "tcp", addr)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	l := newLocker(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	// Once first, so that the release script is loaded: an EVALSHA
	// refused with NOSCRIPT has not run.
	lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if lease, err = l.Acquire(ctx(t), name, fence.TTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	d.Arm()
	err = lease.Release(ctx(t))
	if d.Dropped() != 1 {
		t.Fatalf("%d replies dropped, want the release's", d.Dropped())
	}
	if n := admin.Exists(ctx(t), lockKey(name)).Val(); n != 0 {
		t.Fatalf("the lock is still there after the Release (%v)", err)
	}
	if err != nil {
		t.Fatalf("Release sent again by the adapter, its first run's reply lost = %v, want nil", err)
	}
}
