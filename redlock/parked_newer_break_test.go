package redlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// gateHook holds every script call (EVALSHA, EVAL) once shut, until open
// is closed, and reports on answered the calls that then got an answer
// (not a refused connection).
type gateHook struct {
	shut     atomic.Bool
	open     chan struct{}
	answered chan struct{}
	refused  chan struct{}
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !strings.HasPrefix(cmd.Name(), "eval") {
			return next(ctx, cmd)
		}
		if h.shut.Load() {
			<-h.open
		}
		err := next(ctx, cmd)
		ch := h.answered
		if errors.Is(err, syscall.ECONNREFUSED) {
			ch = h.refused
		}
		select {
		case ch <- struct{}{}:
		default:
		}
		return err
	}
}

func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestParkedReleaseSparesNewerLease: a release refused by node 2 (down) is
// retried; node 2 comes back as a new process, empty, and a newer lease of
// the same name takes it, with nodes 0 and 1. The retry then reaches node
// 2: it must not delete the newer lease's lock there (the release is
// owner-checked), and the newer lease keeps all three nodes.
func TestParkedReleaseSparesNewerLease(t *testing.T) {
	srvs := make([]*redistest.Server, 3)
	for i := range srvs {
		srvs[i] = redistest.Start(t)
	}
	const name = "parked-newer"
	h := &gateHook{open: make(chan struct{}), answered: make(chan struct{}, 100), refused: make(chan struct{}, 100)}
	cs := clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, nil, nil, h)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(ctxFor(t)) })
	other := newLocker(t, srvs, &redlock.Options{NodeTimeout: generous})
	old, err := l.Acquire(ctxFor(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srvs[2].Kill()
	if err := old.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release with node 2 down: %v", err)
	}
	select {
	case <-h.refused:
	case <-time.After(10 * time.Second):
		t.Fatal("the release on node 2 did not end refused within 10 s")
	}
	h.shut.Store(true) // the retries wait until the newer lease holds node 2
	srvs[2].Restart(t)
	newer, err := other.Acquire(ctxFor(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire after node 2 came back: %v", err)
	}
	defer newer.Release(ctxFor(t))
	if on := lockedOn(t, srvs, name); len(on) != 3 {
		t.Fatalf("newer lease locked on %v, want all 3 nodes", on)
	}
	close(h.open)
	select {
	case <-h.answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the parked release did not reach node 2 within 10 s of its return")
	}
	if on := lockedOn(t, srvs, name); len(on) != 3 || newer.Err() != nil {
		t.Fatalf("after the old lease's retried release reached node 2: newer lease locked on %v, Err %v", on, newer.Err())
	}
	if err := newer.Extend(ctxFor(t), time.Minute); err != nil {
		t.Fatalf("Extend of the newer lease: %v", err)
	}
}

// TestParkedReleaseEndsWithLeaseTimeUnclosed: a Locker never closed ends
// its retries of a release refused by a node down for good with the lease
// time (at least a second): no goroutine of it is left.
func TestParkedReleaseEndsWithLeaseTimeUnclosed(t *testing.T) {
	srvs := make([]*redistest.Server, 3)
	for i := range srvs {
		srvs[i] = redistest.Start(t)
	}
	refused := make(chan struct{}, 100)
	cs := clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, nil, nil, refusedHook(refused))
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t), "parked-unclosed", fence.TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	srvs[2].Kill()
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release with node 2 down: %v", err)
	}
	select {
	case <-refused:
	case <-time.After(5 * time.Second):
		t.Fatal("the release on node 2 did not end refused within 5 s")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := goleak.Find(before)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the release (lease time 1 s), Locker not closed: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // a poll with a deadline
	}
}
