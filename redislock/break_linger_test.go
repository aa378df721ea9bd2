package redislock_test

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// slowReplyDialer's connections, while a lease is set, send a request that
// contains match at once but hold the read of its reply until that lease
// has ended: a command that ran on the server in time, whose answer came
// late to a caller that had not given up on it.
type slowReplyDialer struct {
	match []byte
	lease atomic.Pointer[fence.Lease]
	held  atomic.Int64
}

func (d *slowReplyDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &slowReplyConn{Conn: c, d: d}, nil
}

type slowReplyConn struct {
	net.Conn
	d    *slowReplyDialer
	hold atomic.Pointer[fence.Lease] // the next read waits for its end
}

func (c *slowReplyConn) Write(p []byte) (int, error) {
	if lp := c.d.lease.Load(); lp != nil && bytes.Contains(p, c.d.match) {
		c.hold.Store(lp)
	}
	return c.Conn.Write(p)
}

func (c *slowReplyConn) Read(p []byte) (int, error) {
	if lp := c.hold.Swap(nil); lp != nil {
		c.d.held.Add(1)
		select {
		case <-(*lp).Done():
		case <-time.After(10 * time.Second):
		}
	}
	return c.Conn.Read(p)
}

// TestSlowRenewalReplyGivenBackAtLeaseEnd: an Extend(30 s) that ran on Redis
// well before the lease's deadline, but whose reply was read only after the
// lease had ended there (the caller still waiting for it), moved the lock
// 30 s ahead for a lease nobody holds. The lock must be given back
// (owner-checked), as when the reply is lost or given up on
// (TestLostRenewalReplyGivenBackAtLeaseEnd), not held by nobody for 28 s
// more.
func TestSlowRenewalReplyGivenBackAtLeaseEnd(t *testing.T) {
	t.Parallel() // own server; mostly waits for the lease to end
	srv := redistest.Start(t)
	admin := srv.Client(t)
	d := &slowReplyDialer{match: []byte("\r\n30000\r\n")}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: d.Dial})
	t.Cleanup(func() { _ = c.Close() })
	l := newLockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "slow-renewal-reply"
	lease, err := l.Acquire(ctx(t), name, fence.TTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Extend(ctx(t), 2*time.Second); err != nil { // loads the script
		t.Fatal(err)
	}
	d.lease.Store(&lease)
	err = lease.Extend(ctx(t), 30*time.Second)
	d.lease.Store(nil)
	if err == nil || d.held.Load() != 1 {
		t.Fatalf("Extend whose reply came after the lease ended = %v with %d replies held; want an error and 1", err, d.held.Load())
	}
	if lease.Err() == nil {
		t.Fatal("the lease is still held")
	}
	awaitUnlocked(t, admin, name, 5*time.Second, "the lease ended at its deadline")
}

// TestFailedReleaseAfterUnreadRenewalGivesBack: a lease whose Extend(30 s)
// ran on Redis after Extend gave up on it (the lease still held) has its
// lock 30 s ahead of its deadline. A Release that fails (its ctx already
// done, as a deferred Release with a request's ctx) ends the lease without
// deleting the lock: the lock must then be given back as when the lease
// ends unreleased, not held by nobody for the rest of the 30 s.
func TestFailedReleaseAfterUnreadRenewalGivesBack(t *testing.T) {
	const name = "failed-release-unread-renewal"
	lease, admin := unreadRenewalHeld(t, name, 5*time.Second)
	done, cancel := context.WithCancel(ctx(t))
	cancel()
	if err := lease.Release(done); err == nil {
		t.Fatal("Release with a done ctx returned nil")
	}
	awaitUnlocked(t, admin, name, 3*time.Second, "a failed Release ended the lease")
}
