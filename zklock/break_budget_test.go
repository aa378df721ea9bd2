package zklock_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/go-zookeeper/zk"
)

// long is the session timeout of the connections that a test here keeps
// through a pause of its server: go-zookeeper gives a connection up two
// thirds of it (4 s) after the last reply.
const long = 6 * time.Second

// An Acquire whose Wait budget ends while the server hangs (paused: its
// connection open, nothing answered) returns by the budget's end, not by
// the caller's far ctx deadline, nor when go-zookeeper gives the hung
// connection up (two thirds of the session timeout after the last reply,
// 4 s here): the delete of its node on giving up may be sent at once, but
// not waited for beyond a short bound; the node then goes in the
// background, or with the session.
func TestGiveUpOnHungServerKeepsToBudget(t *testing.T) {
	srv := startZK(t)
	addrs := []string{srv.Addr}
	const name = "budget-hung"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Every session here outlasts the pause (go-zookeeper's receive
	// timeout: 4 s): a connection that reconnects with a watch set (the
	// holder's lease) while a reply comes (its Release, sent the moment
	// the session is back) meets a data race in go-zookeeper v1.0.4 (see
	// the package doc, Calls and contexts).
	holderLocker, holderConn := newLockerFor(t, addrs, nil, long)
	// Not the holder's connection, which holds the lease's watch (see
	// TestCleanupNotQueuedWhileDisconnected).
	admin := connect(t, addrs, nil)
	holder, err := holderLocker.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := newLockerFor(t, addrs, nil, long)
	const wait = time.Second
	type result struct {
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		_, err := l.Acquire(ctx, name, fence.Wait(wait))
		done <- result{err, time.Since(start)}
	}()
	// The waiter watches the holder's node (the holder watches it too).
	waitFor(t, func() bool { return totalWatches(t, srv) == "2" })
	srv.Stop()
	t.Cleanup(srv.Cont)
	select {
	case r := <-done:
		t.Logf("Acquire(Wait %v) with the server hung = %v after %v", wait, r.err, r.took)
		if !errors.Is(r.err, fence.ErrHeld) {
			t.Fatalf("Acquire = %v, want ErrHeld", r.err)
		}
		if r.took > wait+700*time.Millisecond {
			t.Fatalf("Acquire with a Wait of %v took %v with the server hung", wait, r.took)
		}
	case <-time.After(wait + 10*time.Second):
		t.Fatal("Acquire still waiting")
	}
	srv.Cont()
	// The waiter's node goes all the same; the holder's stays.
	waitFor(t, func() bool { return len(lockNodes(t, admin, name)) == 1 })
	if err := holder.Err(); err != nil {
		t.Fatalf("the holder's lease, its session longer than the pause, ended: %v", err)
	}
	// Released once the holder's session is back, for the same reason.
	waitFor(t, func() bool { return holderConn.State() == zk.StateHasSession })
	_ = holder.Release(ctx)
}

// An Acquire whose Wait budget ends while a request is out (the server
// hung as the waiter set its watch on the holder's node), its caller's ctx
// alive, must not return an error matching context.DeadlineExceeded: that
// says the caller's ctx ended, which it did not, and a caller that tells
// its own deadline from a held lock by it is misled. The lock was seen
// held: ErrHeld, as when the budget ends between requests.
func TestBudgetEndsDuringRequest(t *testing.T) {
	srv := startZK(t)
	addrs := []string{srv.Addr}
	const name = "budget-in-request"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Sessions that outlast the pause, as in
	// TestGiveUpOnHungServerKeepsToBudget (ci51: the holder's connection
	// reconnected as its Release went out, and met go-zookeeper's race).
	holderLocker, holderConn := newLockerFor(t, addrs, nil, long)
	holder, err := holderLocker.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	var b before
	l, _ := newLockerFor(t, addrs, b.dial, long)
	var stopped atomic.Bool
	f := func(p []byte) {
		// getData (4) of the holder's node: the waiter's watch.
		if len(p) >= 12 && binary.BigEndian.Uint32(p[8:]) == 4 && bytes.Contains(p, []byte(name)) && stopped.CompareAndSwap(false, true) {
			srv.Stop()
		}
	}
	b.f.Store(&f)
	t.Cleanup(srv.Cont)
	_, err = l.Acquire(ctx, name, fence.Wait(time.Second))
	srv.Cont()
	if !stopped.Load() {
		t.Fatal("the server was not paused")
	}
	t.Logf("Acquire = %v", err)
	if errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire whose budget ended in a request, ctx alive = %v, want ErrHeld, not DeadlineExceeded", err)
	}
	// Not sent while the holder reconnects with its lease's watch: see
	// TestGiveUpOnHungServerKeepsToBudget.
	waitFor(t, func() bool { return holderConn.State() == zk.StateHasSession })
	_ = holder.Release(ctx)
}

// An Acquire that finds its node first as the server hangs (paused as the
// Locker sets its watch on the node it now holds, before the lease
// starts), with a Wait budget and a ctx that never ends, returns by the
// budget's end, as when the server hangs at any other step: that last read
// is bounded by the budget too, and not sent again and again through
// go-zookeeper's reconnections for as long as the caller's ctx lives. The
// lock was not seen held by another: a connection error, neither ErrHeld
// nor one matching context.DeadlineExceeded (the caller's ctx did not end).
func TestGrantOnHungServerKeepsToBudget(t *testing.T) {
	srv := startZK(t)
	addrs := []string{srv.Addr}
	const name = "budget-grant-hung"
	_, admin := newLocker(t, addrs)
	var b before
	l := newLockerDialer(t, addrs, b.dial)
	var stopped atomic.Bool
	f := func(p []byte) {
		// getData (4) of its own node: the grant's watch (no holder, so
		// no watch on a predecessor comes first).
		if len(p) >= 12 && binary.BigEndian.Uint32(p[8:]) == 4 && bytes.Contains(p, []byte(name)) && stopped.CompareAndSwap(false, true) {
			srv.Stop()
		}
	}
	b.f.Store(&f)
	t.Cleanup(srv.Cont)
	const wait = time.Second
	type result struct {
		lease fence.Lease
		err   error
		took  time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		lease, err := l.Acquire(context.Background(), name, fence.Wait(wait))
		done <- result{lease, err, time.Since(start)}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(wait + 10*time.Second):
		srv.Cont()
		r = <-done
		t.Fatalf("Acquire(Wait %v), ctx Background, server hung in the grant's read: still waiting after %v (returned %v, %v once the server went on)",
			wait, wait+10*time.Second, r.lease, r.err)
	}
	srv.Cont()
	if !stopped.Load() {
		t.Fatal("the server was not paused")
	}
	t.Logf("Acquire(Wait %v) with the server hung in the grant = %v after %v", wait, r.err, r.took)
	if r.err == nil {
		_ = r.lease.Release(context.Background())
		t.Fatal("Acquire with the server hung took the lock")
	}
	if errors.Is(r.err, fence.ErrHeld) || errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want a connection error, neither ErrHeld nor DeadlineExceeded", r.err)
	}
	if r.took > wait+700*time.Millisecond {
		t.Fatalf("Acquire with a Wait of %v took %v with the server hung", wait, r.took)
	}
	// Its node goes all the same.
	waitFor(t, func() bool { return len(lockNodes(t, admin, name)) == 0 })
}
