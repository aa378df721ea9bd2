package redlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// sentWatch is a go-redis Dialer whose connections, once armed, close sent
// when a write carrying an EVALSHA of hash has gone out: the script is in
// the server's socket.
type sentWatch struct {
	hash  []byte
	armed atomic.Bool
	once  sync.Once
	sent  chan struct{}
}

func newSentWatch(hash string) *sentWatch {
	return &sentWatch{hash: []byte(hash), sent: make(chan struct{})}
}

func (w *sentWatch) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &sentConn{Conn: c, w: w}, nil
}

type sentConn struct {
	net.Conn
	w *sentWatch
}

func (c *sentConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	w := c.w
	if err == nil && w.armed.Load() && bytes.Contains(bytes.ToLower(p), []byte("evalsha")) && bytes.Contains(p, w.hash) {
		w.once.Do(func() { close(w.sent) })
	}
	return n, err
}

// cancelledOnPaused runs call with a context cancelled once the script of
// hash has been written to every paused node (srvs[i] for i >= live), each
// stopped with SIGSTOP, and its reply cannot have come; it returns call's
// the function that wakes them and
// call's error, once call returned (well before the node timeout), the
// nodes still paused.
func cancelledOnPaused(t *testing.T, srvs []*redistest.Server, live int, ws []*sentWatch, call func(ctx context.Context) error) (resume func(), err error) {
	t.Helper()
	for _, w := range ws[live:] {
		w.armed.Store(true)
	}
	resume = pause(t, srvs[live:])
	cctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- call(cctx) }()
	for i, w := range ws[live:] {
		select {
		case <-w.sent:
		case <-time.After(5 * time.Second):
			cancel()
			<-done
			t.Fatalf("the script was never written to paused node %d", live+i)
		}
	}
	cancel()
	select {
	case err = <-done:
	case <-time.After(generous):
		t.Fatalf("the call did not return on cancellation within the node timeout %v", generous)
	}
	if took := time.Since(start); took >= generous {
		t.Fatalf("the call took %v: it waited for the node timeout, not the cancellation", took)
	}
	return resume, err
}

// cancelledNodes makes 3 nodes, clients to them with o, each dialling
// through a sentWatch of hash, and a Locker over them (node timeout
// generous: the cancellation, not the timeout, ends the calls), warmed up
// on name.
func cancelledNodes(t *testing.T, o redis.Options, hash, name string, ttl time.Duration) ([]*redistest.Server, []*sentWatch, *redlock.Locker) {
	t.Helper()
	srvs := nodes(t, 3)
	ws := make([]*sentWatch, len(srvs))
	cs := make([]redis.UniversalClient, len(srvs))
	for i, s := range srvs {
		ws[i] = newSentWatch(hash)
		o := o
		o.Addr, o.Dialer = s.Addr, ws[i].Dial
		c := redis.NewClient(&o)
		t.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	// Scripts loaded (the late EVALSHA must not be refused as NOSCRIPT),
	// connections pooled.
	warmUp(t, l, srvs, name, ttl)
	return srvs, ws, l
}

// cancelClients are the client options the cancellation tests run with:
// go-redis's defaults (retries included), with and without the context's
// deadline on the socket. Without it, go-redis ignores the context for the
// read and waits its ReadTimeout (3 s); with it, the read is bounded by the
// request's context (redlock's requests are detached from the caller's
// cancellation and bounded by the node timeout). redislock's cancelled try
// went wrong only with the latter.
var cancelClients = []struct {
	name string
	o    redis.Options
}{
	{"ContextTimeoutEnabled", redis.Options{ContextTimeoutEnabled: true}},
	{"ReadTimeout", redis.Options{}},
}

// An Acquire cancelled (context.Canceled, before any deadline) after its
// acquisition was written to paused nodes, before their replies: the
// nodes run it when they wake and take the lock, for an Acquire that has
// returned an error. The Locker must give it back on every node (as for a
// node timeout), not leave the name locked for the lease time (a minute
// here) by nobody: redislock had that hole for a cancelled direct try
// (TestCancelledDirectTryGivenBack there). With every node paused, and
// with two of three (the third granting at once, short of a majority).
// redlock holds here by two means, either of which is enough: the
// acquisitions are not cut short by the caller's cancellation, and a grant
// read after the try failed is given back (tryFanout.reply); and the failed
// try revokes every node that had not answered, whatever the error
// (releaseTry). With both disabled, every subtest fails.
func TestCancelledAcquireOnPausedNodesGivenBack(t *testing.T) {
	acqHash, _ := redlock.ScriptHashes()
	const ttl = time.Minute
	for _, cc := range cancelClients {
		for _, live := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/%d of 3 paused", cc.name, 3-live), func(t *testing.T) {
				const name = "cancelled-paused"
				srvs, ws, l := cancelledNodes(t, cc.o, acqHash, name, ttl)
				resume, err := cancelledOnPaused(t, srvs, live, ws, func(ctx context.Context) error {
					lease, err := l.Acquire(ctx, name, fence.TTL(ttl))
					if err == nil {
						_ = lease.Release(ctxFor(t))
						return errors.New("acquired")
					}
					return err
				})
				if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
					t.Fatalf("Acquire cancelled with nodes paused = %v, want ErrNotAcquired and context.Canceled", err)
				}
				resume()
				waitUnlocked(t, srvs, name, 3*time.Second)
				// And the name is free for the next caller at once.
				lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
				if err != nil {
					t.Fatalf("Acquire after the cancelled one: %v", err)
				}
				if err := lease.Release(ctxFor(t)); err != nil {
					t.Fatalf("Release: %v", err)
				}
			})
		}
	}
}

// A Release cancelled after its deletes were written to paused nodes,
// before their replies: it concludes nothing (it must not say the lock
// was deleted on a majority, nor that the lease was lost), the lease
// ends as released, and the deletes, run when the nodes wake, free the
// name on every node well before the lease time (a minute); a second
// Release concludes.
func TestCancelledReleaseOnPausedNodesFrees(t *testing.T) {
	_, relHash := redlock.ScriptHashes()
	const ttl = time.Minute
	for _, cc := range cancelClients {
		for _, live := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/%d of 3 paused", cc.name, 3-live), func(t *testing.T) {
				const name = "cancelled-release"
				srvs, ws, l := cancelledNodes(t, cc.o, relHash, name, ttl)
				lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
				if err != nil {
					t.Fatalf("Acquire: %v", err)
				}
				// Acquire decides at a majority: the last grant may still
				// be on its way, and is to be deleted by the Release.
				for _, s := range srvs {
					waitLocked(t, s, name, 3*time.Second)
				}
				resume, err := cancelledOnPaused(t, srvs, live, ws, lease.Release)
				if err == nil || errors.Is(err, fence.ErrLeaseLost) {
					t.Fatalf("Release cancelled with %d of 3 nodes paused = %v, want an error that concludes nothing", 3-live, err)
				}
				if !errors.Is(lease.Err(), fence.ErrReleased) {
					t.Fatalf("lease Err after the cancelled Release = %v, want ErrReleased", lease.Err())
				}
				resume()
				waitUnlocked(t, srvs, name, 3*time.Second)
				if err := lease.Release(ctxFor(t)); err != nil {
					t.Fatalf("second Release: %v", err)
				}
			})
		}
	}
}
