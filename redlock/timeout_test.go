package redlock_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// slowDialClients returns clients to srvs whose every dial takes delay
// first, as over a slow network or a TLS handshake far away. Clean-up
// ends dials still on their way (go-redis goes on with a dial its caller
// gave up on, in the background).
func slowDialClients(t testing.TB, srvs []*redistest.Server, delay time.Duration) []redis.UniversalClient {
	t.Helper()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	cs := make([]redis.UniversalClient, len(srvs))
	for i, s := range srvs {
		c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true, MaxRetries: -1,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				t := time.NewTimer(delay) // the network's latency, not the test waiting
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-stop:
					return nil, net.ErrClosed
				}
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}})
		t.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	return cs
}

// A node's first dial is not counted against the node timeout: a Locker's
// first acquisition succeeds over connections slower to open than the
// timeout (redlock pings the nodes first, within a bound of its own), and
// is timed, for its validity, from after the dial.
func TestFirstDialNotCountedAgainstNodeTimeout(t *testing.T) {
	srvs := nodes(t, 3)
	const nodeTimeout, dial = 100 * time.Millisecond, 400 * time.Millisecond
	l, err := redlock.New(slowDialClients(t, srvs, dial), &redlock.Options{NodeTimeout: nodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	lease, err := l.Acquire(ctxFor(t), "first-dial", fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("first Acquire over dials of %v with a node timeout of %v: %v", dial, nodeTimeout, err)
	}
	if took := time.Since(start); took < dial {
		t.Fatalf("Acquire took %v, less than a dial (%v): the test's dialer was not used", took, dial)
	}
	if d := lease.Deadline(); d.Before(start.Add(dial + 10*time.Second - 10*time.Second/100 - 2*time.Millisecond)) {
		t.Errorf("deadline %v after the start, want the lease timed from after the dial", d.Sub(start))
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// Status is not held to an acquisition's node timeout: over connections
// slower to open than the timeout, it still reads every node.
func TestStatusNotBoundByNodeTimeout(t *testing.T) {
	srvs := nodes(t, 3)
	l, err := redlock.New(slowDialClients(t, srvs, 300*time.Millisecond), &redlock.Options{NodeTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st, err := l.Status(ctxFor(t), "status-slow")
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range st {
		if n.Err != nil {
			t.Errorf("node %d: %v", i, n.Err)
		}
	}
	// The caller's deadline still bounds it.
	l2, err := redlock.New(slowDialClients(t, srvs, 300*time.Millisecond), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctxFor(t), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	st, err = l2.Status(ctx, "status-slow")
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Status with a 50ms context took %v", took)
	}
	for i, n := range st {
		if n.Err == nil {
			t.Errorf("node %d answered through a 300ms dial within a 50ms context", i)
		}
	}
}

// The default node timeout scales with the lease time, within bounds, and
// never exceeds the lease time less the drift allowance.
func TestDefaultNodeTimeout(t *testing.T) {
	for _, tc := range []struct{ ttl, want time.Duration }{
		{fence.MinTTL, fence.MinTTL - fence.MinTTL/100 - 2*time.Millisecond},
		{300 * time.Millisecond, 100 * time.Millisecond},
		{10 * time.Second, 500 * time.Millisecond},
		{redlock.DefaultWatchdogTTL, time.Second},
		{time.Hour, time.Second},
	} {
		if got := redlock.DefaultNodeTimeout(tc.ttl); got != tc.want {
			t.Errorf("DefaultNodeTimeout(%v) = %v, want %v", tc.ttl, got, tc.want)
		}
	}
}
