package redislock_test

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// writeSeen is a connection that closes seen once a write carrying an
// EVALSHA has gone out while armed.
type writeSeen struct {
	net.Conn
	armed *atomic.Bool
	once  *sync.Once
	seen  chan struct{}
}

func (w writeSeen) Write(b []byte) (int, error) {
	n, err := w.Conn.Write(b)
	if err == nil && w.armed.Load() && bytes.Contains(bytes.ToLower(b), []byte("evalsha")) {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
}

// TestCancelledDirectTryGivenBack: an Acquire whose try goes straight
// through on a client with ContextTimeoutEnabled, to a paused server, is
// cancelled before its deadline, after the script was written. The script
// is in the server's socket: it runs when the server resumes and takes the
// lock, for an Acquire that has returned an error. The Locker must give it
// back (as for a deadline), not leave it held by nobody for its lease time.
// (TestBatchHungServer saw it when its cancelled caller was the one that
// went straight through.)
func TestCancelledDirectTryGivenBack(t *testing.T) {
	srv := redistest.Start(t)
	seen := make(chan struct{})
	var once sync.Once
	var armed atomic.Bool
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return writeSeen{conn, &armed, &once, seen}, nil
		}})
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	const name = "lock:cancelled-direct"
	// The Locker's first calls (the replica record) made, and a
	// connection in the pool.
	warm, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	resume := srv.Pause(t)
	cctx, cancel := context.WithTimeout(ctx(t), 750*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(cctx, name, fence.TTL(time.Minute))
		done <- err
	}()
	select {
	case <-seen:
	case <-time.After(10 * time.Second):
		t.Fatal("the try was never written")
	}
	cancel()
	err = <-done
	if err == nil {
		t.Fatal("Acquire on a paused server succeeded")
	}
	t.Logf("Acquire: %v", err)
	resume()
	admin := srv.Client(t)
	waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey(name)).Val() == 0 })
}
