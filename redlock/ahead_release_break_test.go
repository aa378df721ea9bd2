package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// firstReleaseGate is a hook on a node's client that, once armed, holds the
// first release script call from being sent until open is closed or the
// call's ctx ends (held is closed once it is held, ran once it has run or
// been cut), and lets later ones through, closing passed once the next
// one has been answered.
type firstReleaseGate struct {
	hash   string
	armed  atomic.Bool
	calls  atomic.Int32
	held   chan struct{}
	open   chan struct{}
	ran    chan struct{}
	passed chan struct{}
}

func newFirstReleaseGate() *firstReleaseGate {
	_, hash := redlock.ScriptHashes()
	return &firstReleaseGate{hash: hash, held: make(chan struct{}), open: make(chan struct{}), ran: make(chan struct{}), passed: make(chan struct{})}
}

func (g *firstReleaseGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *firstReleaseGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (g *firstReleaseGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) < 2 || fmt.Sprint(a[1]) != g.hash || !g.armed.Load() {
			return next(ctx, cmd)
		}
		switch g.calls.Add(1) {
		case 1:
			defer close(g.ran)
			close(g.held)
			select {
			case <-g.open:
			case <-ctx.Done():
				cmd.SetErr(ctx.Err())
				return ctx.Err()
			}
			return next(ctx, cmd)
		case 2:
			defer close(g.passed)
		}
		return next(ctx, cmd)
	}
}

// A renewal for 30 s runs on every node, its replies not read in time:
// every node is recorded as ahead. The holder calls Release just as the
// lease's deadline comes: Release's deletes are on their way (held here)
// when the expiry timer goes to end the lease. The lease ended unreleased,
// and the give-back of the nodes ahead must not race Release's own
// deletes: deleting the lock first, it made every one of Release's deletes
// find it gone, and Release reported the lease lost, "removed or taken by
// another owner on 3 of 3 nodes", when nobody else touched it (Release
// returned nil before 7ea97db). Release is called once the deadline has
// passed (the timer's hook calls it): it returns the expiry, as Err would
// have said, and as a lease without an Observer answers
// (TestObservedLeaseEndsAtDeadlineBeforeItsTimer), not a loss to another
// owner. The Observer is told of the end once, as an expiry.
func TestReleaseAtDeadlineNotLostToOwnGiveBack(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "release-at-deadline-ahead"
	gates := make([]*gateExtend, len(srvs))
	rels := make([]*firstReleaseGate, len(srvs))
	hooks := make([]redis.Hook, len(srvs))
	for i := range srvs {
		gates[i] = newGateExtend()
		hooks[i] = gates[i]
		rels[i] = newFirstReleaseGate()
	}
	cs := clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, hooks...)
	for i, c := range cs {
		c.AddHook(rels[i])
	}
	rec := &recorder{}
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	var lease fence.Lease
	released := make(chan error, 1)
	var once sync.Once
	var armed atomic.Bool
	fired := make(chan struct{}) // closed as the timer goes on to end the lease
	relCtx := ctxFor(t)
	redlock.SetExpiryFired(l, func() {
		if !armed.Load() {
			return
		}
		once.Do(func() {
			// The deadline has come: Release is called, and its
			// deletes are on their way when the timer ends the lease.
			go func() { released <- lease.Release(relCtx) }()
			for _, r := range rels {
				select {
				case <-r.held:
				case <-time.After(5 * time.Second):
				}
			}
			close(fired)
		})
	})
	warmRelease(t, l, srvs, name, 3*time.Second)
	lease = warmLease(t, l, name, 3*time.Second)
	for _, g := range gates {
		g.late.Store(true)
	}
	ctx, cancel := context.WithTimeout(ctxFor(t), 500*time.Millisecond)
	err = lease.Extend(ctx, 30*time.Second)
	cancel()
	if err == nil {
		t.Fatal("Extend with no reply read returned nil")
	}
	for i, g := range gates {
		select {
		case <-g.held:
		case <-time.After(5 * time.Second):
			t.Fatalf("node %d did not run the renewal", i)
		}
		close(g.open)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("the lease ended before its deadline: %v", err)
	}
	for _, r := range rels {
		r.armed.Store(true)
	}
	armed.Store(true)
	// Release ends the lease before its deletes leave (Done closes
	// then): the timer, back from the hook once they are under way, finds
	// it ended.
	select {
	case <-fired:
	case <-time.After(20 * time.Second):
		t.Fatal("the expiry timer did not fire at the deadline")
	}
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	for i, r := range rels {
		select {
		case <-r.held:
		default:
			t.Fatalf("Release's delete to node %d was not under way when the timer went to end the lease", i)
		}
	}
	// A give-back of the lease's end, if one is sent, is given time to
	// run before Release's deletes.
	grace, cancelGrace := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelGrace()
	for _, r := range rels {
		select {
		case <-r.passed:
		case <-grace.Done():
		}
	}
	for _, r := range rels {
		close(r.open)
	}
	if err := <-released; !errors.Is(err, fence.ErrLeaseLost) || strings.Contains(err.Error(), "another owner") {
		t.Errorf("Release called as the deadline passed, its deletes done on every node = %v, want the expiry (ErrLeaseLost, not to another owner)", err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Errorf("locked on %v after Release", on)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var ends []fence.LeaseEvent
	for _, e := range rec.ends {
		if e.Token == lease.Token() {
			ends = append(ends, e)
		}
	}
	if len(ends) != 1 {
		t.Errorf("the Observer was told of %d ends of the lease, want 1: %v", len(ends), ends)
	} else if ends[0].Cause != fence.LostExpired {
		t.Errorf("the Observer was told the lease ended as %q (%v): want LostExpired", ends[0].Cause, ends[0].Err)
	}
}
