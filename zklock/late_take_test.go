package zklock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/zkserver"
	"github.com/fencekit/fence/memlock"
)

// stopOnRead is a zk.Dialer whose connections, once armed, stop the server
// (SIGSTOP) just before they write the next getData request (opcode 4:
// the read of its own node that gives an Acquire its token), and close
// stopped then.
type stopOnRead struct {
	srv     *zkserver.Server
	mu      sync.Mutex
	armed   bool
	stopped chan struct{}
}

func (s *stopOnRead) arm() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armed, s.stopped = true, make(chan struct{})
	return s.stopped
}

func (s *stopOnRead) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	conn, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &stopOnReadConn{Conn: conn, s: s}, nil
}

type stopOnReadConn struct {
	net.Conn
	s *stopOnRead
}

func (c *stopOnReadConn) Write(p []byte) (int, error) {
	c.s.mu.Lock()
	if c.s.armed && isOp(4)(p) {
		c.s.armed = false
		c.s.srv.Stop()
		close(c.s.stopped)
	}
	c.s.mu.Unlock()
	return c.Conn.Write(p)
}

// An Acquire whose node is first in line, but whose read of it (the token)
// is answered after the lease time (the server paused): it returned a
// lease already past its deadline. Now a try-once Acquire fails with
// ErrNotAcquired saying the reply came too late, its node deleted (the
// lock free), and one with a wait budget queues again with a new node and
// gets a live lease.
func TestLateTake(t *testing.T) {
	const ttl = 300 * time.Millisecond
	srv := startZK(t)
	probe, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, wait := range []time.Duration{0, 10 * time.Second} {
		t.Run("wait="+wait.String(), func(t *testing.T) {
			s := &stopOnRead{srv: srv}
			l := longLocker(t, srv.Addr, s.dial)
			name := t.Name()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			warm, err := l.Acquire(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if err := warm.Release(ctx); err != nil {
				t.Fatal(err)
			}
			stopped := s.arm()
			type result struct {
				lease fence.Lease
				err   error
			}
			got := make(chan result, 1)
			go func() {
				ls, err := l.Acquire(ctx, name, fence.TTL(ttl), fence.Wait(wait))
				got <- result{ls, err}
			}()
			select {
			case <-stopped:
			case <-time.After(10 * time.Second):
				t.Fatal("the Acquire's read not sent after 10 s")
			}
			// A lease of twice the lease time, taken once the read was
			// on its way, runs out: then the server resumes.
			pl, err := probe.Acquire(ctx, name, fence.TTL(2*ttl))
			if err != nil {
				srv.Cont()
				t.Fatal(err)
			}
			<-pl.Done()
			srv.Cont()
			var r result
			select {
			case r = <-got:
			case <-time.After(20 * time.Second):
				t.Fatal("Acquire has not returned 20 s after the server resumed")
			}
			if r.lease != nil {
				defer r.lease.Release(context.Background()) //nolint:errcheck // the verdict is on Err and Deadline
			}
			if wait == 0 {
				if r.lease != nil {
					t.Fatalf("Acquire whose read came late returned a lease, deadline %v ago, Err = %v", time.Since(r.lease.Deadline()).Round(time.Millisecond), r.lease.Err())
				}
				if !errors.Is(r.err, fence.ErrNotAcquired) || !errors.Is(r.err, fence.ErrLeaseLost) || !strings.Contains(r.err.Error(), "too late") {
					t.Fatalf("Acquire = %v, want ErrNotAcquired saying the reply came too late", r.err)
				}
				t.Logf("Acquire: %v", r.err)
				other, err := longLocker(t, srv.Addr, nil).Acquire(ctx, name, fence.TTL(time.Minute))
				if err != nil {
					t.Fatalf("after the late take was given back: %v", err)
				}
				_ = other.Release(ctx)
				return
			}
			if r.err != nil {
				t.Fatalf("Acquire with %v to wait after a late take: %v", wait, r.err)
			}
			if !time.Now().Before(r.lease.Deadline()) || r.lease.Err() != nil {
				t.Fatalf("Acquire returned a lease already ended: deadline %v ago, Err = %v", time.Since(r.lease.Deadline()).Round(time.Millisecond), r.lease.Err())
			}
		})
	}
}
