package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// TestExtendBackgroundGiveBackCloseWaits attacks 1b9f4eb: the give-back
// of a renewal read after the lease ended goes on in the background once
// the Extend's ctx ended. A Release called then must say the lease was
// lost (not hang on, or be confused by, the give-back's deletes), and
// Close must wait for those deletes: a Close whose ctx ends first reports
// them (*CloseError), and a Close that returns nil leaves the lock on no
// node.
func TestExtendBackgroundGiveBackCloseWaits(t *testing.T) {
	bgGiveBackCloseWaits(t, false, false, false)
}

// TestExtendBackgroundGiveBackThenAcquireAgain: the give-back's deletes
// still held, Release frees the lock and the same Locker takes it again (a
// new owner): the deletes, let go then, must leave that lease's lock.
func TestExtendBackgroundGiveBackThenAcquireAgain(t *testing.T) {
	bgGiveBackCloseWaits(t, false, true, false)
}

// TestWatchdogBackgroundGiveBackCloseWaits: the same for the watchdog's
// renewal, whose ctx (bounded by the lease's deadline) has always ended by
// the time it reads that the lease ended: its give-back is never waited
// for, and the watchdog is done at once. Release, which waits for the
// watchdog, must still say the lease was lost, and Close must wait for
// the deletes.
func TestWatchdogBackgroundGiveBackCloseWaits(t *testing.T) {
	bgGiveBackCloseWaits(t, true, false, false)
}

// TestWatchdogBackgroundGiveBackClientsClosed: the same, the clients
// closed after a Close that gave up, the give-back's deletes still held.
func TestWatchdogBackgroundGiveBackClientsClosed(t *testing.T) {
	bgGiveBackCloseWaits(t, true, false, true)
}

func bgGiveBackCloseWaits(t *testing.T, watchdog, again, closeClients bool) {
	srvs := nodes(t, 3)
	name := "bg-giveback-close"
	if watchdog {
		name += "-watchdog"
	}
	const ttl = 1500 * time.Millisecond
	gates := make([]*gateExtend, len(srvs))
	rels := make([]*firstReleaseGate, len(srvs))
	hooks := make([]redis.Hook, len(srvs))
	for i := range gates {
		gates[i] = newGateExtend()
		hooks[i] = gates[i]
		rels[i] = newFirstReleaseGate()
	}
	cs := clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, hooks...)
	for i, c := range cs {
		c.(*redis.Client).AddHook(rels[i])
	}
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous, WatchdogTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	opened := false
	openRels := func() {
		if !opened {
			opened = true
			for _, r := range rels {
				close(r.open)
			}
		}
	}
	t.Cleanup(func() {
		openRels()
		_, _ = closeWithin(l, 10*time.Second)
	})
	warmRelease(t, l, srvs, name, ttl)
	var lease fence.Lease
	if watchdog {
		// Its first renewal, a third of the way in, is held.
		for _, g := range gates {
			g.late.Store(true)
		}
		lease, err = l.Acquire(ctxFor(t), name)
		if err != nil {
			t.Fatal(err)
		}
	} else {
		lease = warmLease(t, l, name, ttl)
		for _, g := range gates {
			g.late.Store(true)
		}
	}
	ended := lease.Done()
	released := make(chan struct{})
	// ahead: the nodes where the held renewal renewed the lock, which the
	// give-back deletes. On a loaded machine a renewal may run on a node
	// after the lock ran out there (ttl 1.5 s), and be refused: no
	// give-back goes there (ci64: "node 0: the give-back's delete was not
	// held"). Written before released is closed. (The watchdog's renewal
	// shows no reply to the hook, whose premise never failed so: every
	// node is taken for ahead there.)
	ahead := make([]bool, len(srvs))
	go func() {
		defer close(released)
		for _, g := range gates {
			select {
			case <-g.held:
			case <-time.After(5 * time.Second):
				return
			}
		}
		for i, g := range gates {
			ahead[i] = watchdog || g.renewed.Load()
		}
		// The renewal ran on every node; the give-back that follows it
		// (as soon as the watchdog's renewal gives up at the deadline,
		// or once the replies are read) is held.
		for _, r := range rels {
			r.armed.Store(true)
		}
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			return
		}
		for _, g := range gates {
			close(g.open)
		}
	}()
	if watchdog {
		<-released
	} else {
		dl := lease.Deadline().Add(300 * time.Millisecond)
		ectx, cancel := context.WithDeadline(ctxFor(t), dl)
		defer cancel()
		err = lease.Extend(ectx, 30*time.Second)
		<-released
		if err == nil || !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Extend = %v, want an error matching fence.ErrLeaseLost", err)
		}
	}
	t.Logf("renewed (ahead) by node: %v", ahead)
	for i, r := range rels {
		if !ahead[i] {
			continue
		}
		select {
		case <-r.held:
		case <-time.After(5 * time.Second):
			t.Fatalf("node %d: the give-back's delete was not held (Extend: %v)", i, err)
		}
	}
	// The renewal moved each node's lock a lease time from when it ran
	// there; on a loaded machine one that ran early may have run out by
	// now (ci50: on nodes [0 1]). The give-back is held on every node; it
	// must find the lock on one at least for what follows to mean much.
	held := valuesOn(t, srvs, name)
	oldOwner := ""
	for _, v := range held {
		if v != "" {
			oldOwner = v
		}
	}
	if oldOwner == "" {
		t.Fatalf("with the give-back held, the lock is on no node")
	}
	t.Logf("with the give-back held, the lock's values by node: %q", held)
	// Release, the give-back's deletes still held: the lease was lost
	// before it.
	rctx, rcancel := context.WithTimeout(ctxFor(t), 5*time.Second)
	start := time.Now()
	rerr := lease.Release(rctx)
	rcancel()
	t.Logf("Release after %v: %v", time.Since(start).Round(time.Millisecond), rerr)
	if !errors.Is(rerr, fence.ErrLeaseLost) {
		t.Errorf("Release = %v, want an error matching fence.ErrLeaseLost (the lease ended before it)", rerr)
	}
	if again {
		lease2, err := l.Acquire(ctxFor(t), name, fence.TTL(30*time.Second))
		if err != nil {
			t.Fatalf("Acquire again, the lease's give-back held: %v", err)
		}
		// The new lease's lock is on a majority at least: a node where the
		// old lock had not run out yet refused it (ci51: node 0).
		taken := valuesOn(t, srvs, name)
		openRels()
		for i, r := range rels {
			if !ahead[i] {
				continue
			}
			select {
			case <-r.ran:
			case <-time.After(5 * time.Second):
				t.Fatalf("node %d: the held delete did not run", i)
			}
		}
		after := valuesOn(t, srvs, name)
		t.Logf("values by node: old lease %q, new lease taken %q, the deletes let go %q", oldOwner, taken, after)
		mine := 0
		for i := range srvs {
			switch {
			case taken[i] == oldOwner && after[i] != "":
				t.Errorf("node %d: the old lease's lock is still there after its give-back ran (%q)", i, after[i])
			case taken[i] != oldOwner && after[i] != taken[i]:
				t.Errorf("node %d: the old lease's give-back, let go, changed the new lease's lock from %q to %q", i, taken[i], after[i])
			case taken[i] != oldOwner && taken[i] != "":
				mine++
			}
		}
		if mine < len(srvs)/2+1 || lease2.Err() != nil {
			t.Fatalf("the new lease holds its lock on %d of %d nodes after the give-back ran (Err %v)", mine, len(srvs), lease2.Err())
		}
		if err := lease2.Release(ctxFor(t)); err != nil {
			t.Fatalf("Release of the new lease: %v", err)
		}
		return
	}
	// Close with the give-back still held: it must not say everything is
	// done.
	_, cerr := closeWithin(l, 300*time.Millisecond)
	var ce *redlock.CloseError
	if !errors.As(cerr, &ce) {
		t.Errorf("Close with the give-back's deletes held = %v, want a *CloseError (it did not wait for them)", cerr)
	}
	if closeClients {
		// The caller, told by Close that the work had not finished,
		// closes the clients anyway: the held deletes then fail on
		// closed clients (no panic), and a later Close returns once
		// they have.
		for _, c := range cs {
			_ = c.Close()
		}
		openRels()
		for i, r := range rels {
			if !ahead[i] {
				continue
			}
			select {
			case <-r.ran:
			case <-time.After(5 * time.Second):
				t.Fatalf("node %d: the held delete did not end", i)
			}
		}
		if _, cerr := closeWithin(l, 10*time.Second); cerr != nil {
			t.Errorf("Close once the deletes failed on closed clients = %v, want nil", cerr)
		}
		return
	}
	openRels()
	if _, cerr := closeWithin(l, 10*time.Second); cerr != nil {
		t.Errorf("Close once the deletes went on = %v, want nil", cerr)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Errorf("Close returned with the lock still on nodes %v", on)
	}
}

// valuesOn returns the value of name's lock key on each of srvs, "" where
// there is none.
func valuesOn(t testing.TB, srvs []*redistest.Server, name string) []string {
	t.Helper()
	vals := make([]string, len(srvs))
	for i, s := range srvs {
		v, err := s.Client(t).Get(ctxFor(t), lockKey(name)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("GET on node %d: %v", i, err)
		}
		vals[i] = v
	}
	return vals
}
