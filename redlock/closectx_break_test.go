package redlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// An acquisition that Close overtook (its majority granted, Close called
// before it returned) releases its lease at once and fails with ErrClosed.
// That release waited for the nodes whatever the caller's context said
// (context.WithoutCancel): with the nodes hung, Acquire returned at the
// node timeout, seconds past its caller's deadline. The release's requests
// are the Locker's background work, which Close waits for; the caller need
// not.
func TestAcquireOvertakenByCloseKeepsItsDeadline(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl, nodeTimeout = "close-overtaken-ctx", 30 * time.Second, 6 * time.Second
	l := newLocker(t, srvs, &redlock.Options{NodeTimeout: nodeTimeout})
	warm, err := l.Acquire(ctxFor(t), name+"-warm", fence.TTL(ttl)) // dials, loads the scripts
	if err != nil {
		t.Fatalf("warm-up Acquire: %v", err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatalf("warm-up Release: %v", err)
	}
	closed := make(chan error, 1)
	var armed atomic.Bool
	armed.Store(true)
	var resumes []func()
	redlock.SetBeforeReplies(l, func() {
		if !armed.CompareAndSwap(true, false) {
			return // the probes' own tries
		}
		go func() { _, err := closeWithin(l, 30*time.Second); closed <- err }()
		deadline := time.Now().Add(5 * time.Second)
		if !waitClosing(t, l, name, ttl) {
			return
		}
		for len(lockedOn(t, srvs, name)) < len(srvs) { // every node ran the acquisition
			if time.Now().After(deadline) {
				t.Error("the acquisition did not run on every node")
				return
			}
			time.Sleep(time.Millisecond) // polling with a deadline
		}
		for _, s := range srvs { // their replies are on their way: now they hang
			resumes = append(resumes, s.Pause(t))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = l.Acquire(ctx, name, fence.TTL(ttl))
	late := time.Since(deadlineOf(ctx))
	for _, r := range resumes {
		r()
	}
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, redlock.ErrClosed) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire overtaken by Close = %v, want ErrClosed or its context's error", err)
	}
	if late > 500*time.Millisecond {
		t.Errorf("Acquire returned %v after its context's deadline (node timeout %v)", late.Round(time.Millisecond), nodeTimeout)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("locked on %v after Close returned nil", on)
	}
}

func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}
