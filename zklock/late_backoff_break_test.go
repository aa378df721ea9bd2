package zklock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// slowRead is a zk.Dialer whose connections hold every getData request
// (opcode 4: the read of its own node that gives an Acquire its token)
// for delay before writing it, and count them. Creates, deletes and pings
// go out at once.
type slowRead struct {
	delay time.Duration
	reads atomic.Int64
}

func (s *slowRead) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	conn, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &slowReadConn{Conn: conn, s: s}, nil
}

type slowReadConn struct {
	net.Conn
	s *slowRead
}

func (c *slowReadConn) Write(p []byte) (int, error) {
	if isOp(4)(p) {
		c.s.reads.Add(1)
		tm := time.NewTimer(c.s.delay) // the fault: the read goes out late
		<-tm.C
	}
	return c.Conn.Write(p)
}

// TestLateTakesBackOff: every read of the Acquire's own node is held
// 15 ms, longer than a lease of fence.MinTTL, so every take is answered
// past the lease's deadline and given back (its node deleted). An Acquire
// with a 1 s budget queues again until the budget ends; each round is a
// create, a read and a delete, two of them writes through the ensemble's
// quorum, on a server already too slow, and it made them at once, one
// round after another. With a back-off of 10 ms doubling (jittered to
// half or more), the pauses alone leave room for no more than nine rounds
// in 1 s; without one, a round costs 15 ms and three round trips.
func TestLateTakesBackOff(t *testing.T) {
	const wait = time.Second
	srv := sharedZK(t)
	s := &slowRead{delay: 15 * time.Millisecond}
	l := longLocker(t, srv.Addr, s.dial)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := t.Name()
	start := time.Now()
	ls, err := l.Acquire(ctx, name, fence.TTL(fence.MinTTL), fence.Wait(wait))
	took := time.Since(start)
	if ls != nil {
		_ = ls.Release(context.Background())
		t.Fatalf("Acquire returned a lease, Err %v", ls.Err())
	}
	n := s.reads.Load()
	t.Logf("Acquire after %v, %d reads of its node: %v", took.Round(time.Millisecond), n, err)
	// The last round's read may be the one the budget's end cuts short.
	if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "too late") && !strings.Contains(err.Error(), "wait budget ended") {
		t.Fatalf("Acquire = %v, want ErrNotAcquired saying the reply came too late", err)
	}
	if took < wait-100*time.Millisecond || took > wait+2*time.Second {
		t.Errorf("Acquire with a %v budget returned after %v", wait, took.Round(time.Millisecond))
	}
	if n < 2 {
		t.Errorf("%d reads in a %v budget: the late take was not tried again", n, wait)
	}
	if n > 12 {
		t.Errorf("%d takes in a %v budget, every one answered too late: no back-off between them", n, wait)
	}
	// Every node given back: the lock is free (at once, or within
	// moments when a loaded machine left the last delete to cleanup,
	// past giveUpTimeout: seen once beside other packages' tests).
	other := newLockerDialer(t, []string{srv.Addr}, nil)
	ol, err := other.Acquire(ctx, name, fence.TTL(time.Minute), fence.Wait(5*time.Second))
	if err != nil {
		t.Fatalf("after the late takes were given back: %v", err)
	}
	_ = ol.Release(ctx)
}

// TestLateTakesBackOffCallerDeadline: the back-off between late takes
// ends with the caller's ctx, not only with the wait budget: with every
// take late, a 10 s budget and a ctx of 400 ms, Acquire returns the ctx's
// error soon after it ends, and leaves no node behind.
func TestLateTakesBackOffCallerDeadline(t *testing.T) {
	srv := sharedZK(t)
	s := &slowRead{delay: 15 * time.Millisecond}
	l := longLocker(t, srv.Addr, s.dial)
	name := t.Name()
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	start := time.Now()
	ls, err := l.Acquire(ctx, name, fence.TTL(fence.MinTTL), fence.Wait(10*time.Second))
	took := time.Since(start)
	if ls != nil {
		_ = ls.Release(context.Background())
		t.Fatalf("Acquire returned a lease, Err %v", ls.Err())
	}
	t.Logf("Acquire after %v, %d reads of its node: %v", took.Round(time.Millisecond), s.reads.Load(), err)
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired and the ctx's DeadlineExceeded", err)
	}
	if took > 2*time.Second {
		t.Errorf("Acquire with a 400ms ctx returned after %v", took.Round(time.Millisecond))
	}
	// No node left: the lock is free, within moments (the give-back of
	// the take that the ctx's end cut short is cleanup's, in the
	// background: a fresh-clone CI run found it held at once).
	tctx, tcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer tcancel()
	ol, err := newLockerDialer(t, []string{srv.Addr}, nil).Acquire(tctx, name, fence.TTL(time.Minute), fence.Wait(5*time.Second))
	if err != nil {
		t.Fatalf("after the late takes were given back: %v", err)
	}
	_ = ol.Release(tctx)
}
