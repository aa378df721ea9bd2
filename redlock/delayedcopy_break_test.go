package redlock_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// firstDelayer is a go-redis Dialer whose connections, once armed, hold
// back the first write containing match, as a stalled TCP connection does:
// the client's read times out, go-redis closes the connection (the close
// is held too, behind the write, as a FIN is behind the data) and sends the
// command again on a new one. Let delivers the held copy late, and reads
// its reply: the server has run it.
type firstDelayer struct {
	match []byte
	armed atomic.Bool

	mu   sync.Mutex
	held []*delayConn
}

func (d *firstDelayer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &delayConn{Conn: c, d: d}, nil
}

// Let sends the held writes, reads their replies and closes their
// connections.
func (d *firstDelayer) Let(t testing.TB) {
	d.mu.Lock()
	held := d.held
	d.held = nil
	d.mu.Unlock()
	for _, c := range held {
		_ = c.Conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Conn.Write(c.p); err != nil {
			t.Fatalf("delivering the held copy: %v", err)
		}
		var b [256]byte
		if _, err := c.Conn.Read(b[:]); err != nil {
			t.Fatalf("reading the held copy's reply: %v", err)
		}
		_ = c.Conn.Close()
	}
}

type delayConn struct {
	net.Conn
	d *firstDelayer
	p []byte // the held write; the close waits for it
}

func (c *delayConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.d.match) && c.d.armed.CompareAndSwap(true, false) {
		c.d.mu.Lock()
		c.p = bytes.Clone(p)
		c.d.held = append(c.d.held, c)
		c.d.mu.Unlock()
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *delayConn) Close() error {
	c.d.mu.Lock()
	held := c.p != nil
	c.d.mu.Unlock()
	if held {
		return nil // Let closes it, after the held write
	}
	return c.Conn.Close()
}

// lockerOver returns a Locker (NodeTimeout generous) over one client per
// options, each closed in t.Cleanup.
func lockerOver(t testing.TB, opts ...*redis.Options) *redlock.Locker {
	t.Helper()
	cs := make([]redis.UniversalClient, len(opts))
	for i, o := range opts {
		c := redis.NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// delayedLocker returns a Locker over srvs whose clients resend after a
// 100 ms read timeout, and the delayer of each one's acquisitions.
func delayedLocker(t testing.TB, srvs []*redistest.Server) (*redlock.Locker, []*firstDelayer) {
	t.Helper()
	acq, _ := redlock.ScriptHashes()
	ds := make([]*firstDelayer, len(srvs))
	opts := make([]*redis.Options, len(srvs))
	for i, s := range srvs {
		ds[i] = &firstDelayer{match: []byte(acq)}
		opts[i] = &redis.Options{Addr: s.Addr, ReadTimeout: 100 * time.Millisecond, Dialer: ds[i].Dial}
	}
	return lockerOver(t, opts...), ds
}

// A client whose ReadTimeout is shorter than the node timeout has go-redis
// send an acquisition again when the first copy's reply is slow; the
// second grants, and the first, delayed on its way, may run after the
// lease was released. Release used to delete the lock on those nodes
// without the revocation mark (their grant came), so the first copy took
// the lock there again, for its whole lease time, for nobody: with it
// delayed on two nodes of three, nobody could take the name for the lease
// time, though the package says that no node that answered late keeps a
// lock. A try whose request took half its client's read timeout (as
// redislock decides) is now released everywhere with the mark.
func TestDelayedAcquisitionCopyAfterRelease(t *testing.T) {
	srvs := nodes(t, 3)
	l, ds := delayedLocker(t, srvs)
	const name, ttl = "delayed-copy", 30 * time.Second
	warmUp(t, l, srvs, name, ttl)

	// Node 2 down: the lease needs both delayed nodes' grants, and
	// deletes the lock there with no mark.
	srvs[2].Kill()
	ds[0].armed.Store(true)
	ds[1].armed.Store(true)
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitUnlocked(t, srvs[:2], name, 5*time.Second)
	ds[0].Let(t)
	ds[1].Let(t)
	srvs[2].Restart(t)
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		other := newLocker(t, srvs, &redlock.Options{NodeTimeout: generous})
		_, err := other.Acquire(ctxFor(t), name, fence.TTL(ttl))
		t.Errorf("after Release, the delayed copies of its acquisition locked nodes %v; another Locker's Acquire: %v", on, err)
	}
	if err := l.Close(ctxFor(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// The same delayed copy after a try that failed once the grant it brought
// had come: node 0 grants through go-redis's second copy, node 1 is held
// by another owner, and node 2, paused, answers with its client's read
// timeout (no resend) after that, so the try fails with node 0 granted and
// gives it back there (Locker.releaseTry), where the first copy then runs.
func TestDelayedAcquisitionCopyAfterFailedTry(t *testing.T) {
	srvs := nodes(t, 3)
	acq, _ := redlock.ScriptHashes()
	d := &firstDelayer{match: []byte(acq)}
	opts := []*redis.Options{
		{Addr: srvs[0].Addr, ReadTimeout: 100 * time.Millisecond, Dialer: d.Dial},
		{Addr: srvs[1].Addr, MaxRetries: -1},
		{Addr: srvs[2].Addr, ReadTimeout: time.Second, MaxRetries: -1},
	}
	l := lockerOver(t, opts...)
	const name, ttl = "delayed-copy-failed-try", 30 * time.Second
	warmUp(t, l, srvs, name, ttl)

	other := srvs[1].Client(t)
	if err := other.Set(ctxFor(t), lockKey(name), "another owner", ttl).Err(); err != nil {
		t.Fatal(err)
	}
	resume := srvs[2].Pause(t)
	d.armed.Store(true)
	_, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	resume()
	if !errors.Is(err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire with node 1 held and node 2 paused = %v, want ErrNotAcquired", err)
	}
	waitUnlocked(t, srvs[:1], name, 5*time.Second) // the try's give-back
	d.Let(t)
	if on := lockedOn(t, srvs[:1], name); len(on) != 0 {
		t.Errorf("after the failed try (%v), the delayed copy of its acquisition locked node 0 again", err)
	}
	if err := other.Del(ctxFor(t), lockKey(name)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctxFor(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
