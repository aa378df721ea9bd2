package redlock_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// replyDropper is a go-redis Dialer whose connections, once armed, lose the
// reply to the next write containing match: the server runs the command,
// its reply starts to come, and the connection is closed under the client,
// which reads io.EOF. go-redis sends the command again on a new connection
// (MaxRetries, 3 by default): the server runs it twice.
type replyDropper struct {
	match []byte
	left  atomic.Int32        // replies still to drop
	lose  func(p []byte) bool // if set, decides in place of match and left
}

// loses tells whether the reply to write p is to be lost.
func (d *replyDropper) loses(p []byte) bool {
	if d.lose != nil {
		return d.lose(p)
	}
	return bytes.Contains(p, d.match) && d.left.Add(-1) >= 0
}

func (d *replyDropper) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &dropConn{Conn: c, d: d}, nil
}

type dropConn struct {
	net.Conn
	d    *replyDropper
	drop atomic.Bool
}

func (c *dropConn) Write(p []byte) (int, error) {
	if c.d.loses(p) {
		c.drop.Store(true)
	}
	return c.Conn.Write(p)
}

func (c *dropConn) Read(p []byte) (int, error) {
	if c.drop.Load() {
		// Wait for the reply to start (the command ran), then lose it.
		var b [1]byte
		_, _ = io.ReadFull(c.Conn, b[:])
		_ = c.Conn.Close()
		return 0, io.EOF
	}
	return c.Conn.Read(p)
}

// warmUp takes and releases name once, which loads the scripts on every
// node, and waits until it is free on every node.
func warmUp(t testing.TB, l *redlock.Locker, srvs []*redistest.Server, name string, ttl time.Duration) {
	t.Helper()
	warm, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("warm-up Acquire: %v", err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatalf("warm-up Release: %v", err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
}

// retryingClients returns one client per server with go-redis's default
// MaxRetries, each dialling through its own replyDropper of match.
func retryingClients(t testing.TB, srvs []*redistest.Server, match string) ([]redis.UniversalClient, []*replyDropper) {
	t.Helper()
	cs := make([]redis.UniversalClient, len(srvs))
	ds := make([]*replyDropper, len(srvs))
	for i, s := range srvs {
		ds[i] = &replyDropper{match: []byte(match)}
		c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true, Dialer: ds[i].Dial})
		t.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	return cs, ds
}

// A node whose reply to the acquisition is lost after it ran it (the
// connection closed under the client) is asked again by go-redis itself,
// with the same owner, and finds the lock its own there. That answered
// held by another owner: a try whose replies were lost so on a majority
// failed with ErrHeld and left the lock taken on those nodes (not given
// back: "held by another owner") for its lease time, so that nobody could
// take the name. The try may fail (such a node cannot count as a grant:
// two clients of one server find the lock their try's the same way, see
// TestFailoverClientsOfOneMaster), but it must give the lock back.
func TestRetriedAcquisitionFindsItsOwnLock(t *testing.T) {
	srvs := nodes(t, 3)
	acq, _ := redlock.ScriptHashes()
	cs, ds := retryingClients(t, srvs, acq)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	const name, ttl = "retried-acquire", 30 * time.Second
	warmUp(t, l, srvs, name, ttl)

	ds[0].left.Store(1)
	ds[1].left.Store(1)
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err == nil {
		if err := lease.Release(ctxFor(t)); err != nil {
			t.Fatalf("Release: %v", err)
		}
	} else if errors.Is(err, fence.ErrHeld) {
		t.Errorf("Acquire with its replies lost (and retried) on 2 of 3 nodes = %v: held by nobody else", err)
	}
	t.Logf("Acquire with its replies lost (and retried) on 2 of 3 nodes: %v", err)
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		other := newLocker(t, srvs, &redlock.Options{NodeTimeout: generous})
		_, err2 := other.Acquire(ctxFor(t), name, fence.TTL(ttl))
		t.Fatalf("after that Acquire (%v), the lock is left on nodes %v; another Locker's Acquire: %v", err, on, err2)
	}
	again, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("the next Acquire: %v", err)
	}
	if err := again.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
	if err := l.Close(ctxFor(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// A node whose reply to Release's delete is lost after it ran it is asked
// again by go-redis, which finds the lock gone: counted as removed by
// another owner, two such nodes of three made Release report the lease
// lost, when it had held the lock to the end and deleted it everywhere.
//
// Not fixed here: the node cannot tell a delete run twice from a lock that
// expired or was taken, unless the first run leaves a mark (a tombstone of
// the owner, as redislock's release leaves its revocation mark) that the
// second finds: one more write per node and per Release, and a key kept
// for as long as a copy may arrive, a cost and a change of the release
// script's answers to decide on. Until then, a Locker's clients should be
// made with MaxRetries: -1 (every test here does so otherwise).
func TestRetriedReleaseCountsItsOwnDelete(t *testing.T) {
	t.Skip("bug: a delete that go-redis sends again after its reply was lost finds the lock gone and counts as lost; " +
		"telling it from a lost lock needs a tombstone written by every release, a design decision")
	srvs := nodes(t, 3)
	_, rel := redlock.ScriptHashes()
	cs, ds := retryingClients(t, srvs, rel)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	const name, ttl = "retried-release", 30 * time.Second
	warmUp(t, l, srvs, name, ttl)

	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if got := lockedOn(t, srvs, name); len(got) != 3 {
		t.Fatalf("locked on nodes %v, want all 3", got)
	}
	ds[0].left.Store(1)
	ds[1].left.Store(1)
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Errorf("Release, its deletes' replies lost (and retried) on 2 of 3 nodes: %v, want nil", err)
	}
	if err := lease.Err(); !errors.Is(err, fence.ErrReleased) {
		t.Errorf("Err after Release = %v, want ErrReleased", err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
	if err := l.Close(ctxFor(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
