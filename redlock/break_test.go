package redlock_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// A caller whose deadline is shorter than the node timeout gets its answer
// by its deadline, even when a node that granted the try hangs before it
// can be given the try back: the try fails (no majority by the deadline),
// and its release on the node that granted it must not keep the caller
// waiting for the node timeout.
func TestCallerDeadlineWithGrantedNodeHung(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "deadline-granted-hung"
	l := lateLocker(t, srvs, name)
	pause(t, srvs[1:]) // no majority can grant before the deadline
	redlock.SetBeforeReplies(l, func() {
		// Node 0 granted the try; it hangs before its release.
		waitLocked(t, srvs[0], name, 5*time.Second)
		srvs[0].Signal(syscall.SIGSTOP)
		t.Cleanup(func() { srvs[0].Signal(syscall.SIGCONT) })
	})
	const budget = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(ctxFor(t), budget)
	defer cancel()
	start := time.Now()
	_, err := l.Acquire(ctx, name, fence.TTL(30*time.Second))
	took := time.Since(start)
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	if took > budget+lateNodeTimeout/4 {
		t.Fatalf("Acquire with a %v deadline took %v (node timeout %v): it waited for the hung node that granted", budget, took, lateNodeTimeout)
	}
	redlock.SetBeforeReplies(l, nil)
	for _, s := range srvs {
		s.Signal(syscall.SIGCONT)
	}
	// Nothing of the try is left once the nodes woke.
	waitUnlocked(t, srvs, name, 5*time.Second)
}
