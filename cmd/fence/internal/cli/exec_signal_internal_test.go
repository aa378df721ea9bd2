//go:build linux

package cli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/spf13/cobra"
)

// TestExecSignalBeforeStartNotLost: SIGINT or SIGTERM that reaches fence
// after its Acquire returned the lease and before runHolding passes
// signals on to the command (or during an Acquire that succeeded anyway)
// is seen only by Main's signal context. The command must not be started
// then: before, runHolding started it regardless and ran it to the end,
// the interrupt lost, an irreversible command run after the caller (^C, a
// timeout(1), systemd stop) asked fence to stop. Here the context is
// cancelled as Main's is by such a signal, and runHolding is called: the
// command must not run, exec exits 130 and the lock is free.
func TestExecSignalBeforeStartNotLost(t *testing.T) {
	srv := redistest.Start(t)
	l, err := redislock.New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(context.Background(), "interrupted")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the signal, seen by Main's signal.NotifyContext
	cmd := &cobra.Command{}
	cmd.SetContext(ctx)
	cmd.SetOut(new(syncBuffer))
	cmd.SetErr(new(syncBuffer))
	ran := filepath.Join(t.TempDir(), "ran")
	err = runHolding(cmd, lease, []string{"sh", "-c", "touch " + ran}, time.Second)
	if _, statErr := os.Stat(ran); statErr == nil {
		t.Error("the command ran after fence was interrupted")
	}
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != ExitInterrupted {
		t.Errorf("runHolding: %v, want exit %d", err, ExitInterrupted)
	}
	if n := srv.Client(t).Exists(context.Background(), "fence:{interrupted}").Val(); n != 0 {
		t.Error("the lock is still held")
	}
}

// TestExecLeaseEndedBeforeStartNotStarted: a lease that ended between
// Acquire and the command's start (fence paused there past the lease time,
// an operator's DEL, a failover) must not start the command, which may be
// irreversible: before, runHolding started it, and only then noticed the
// lost lease and sent SIGTERM, which a short command outruns. Here the
// lease's TTL runs out before runHolding: the command must not run, and
// exec exits 76.
func TestExecLeaseEndedBeforeStartNotStarted(t *testing.T) {
	srv := redistest.Start(t)
	l, err := redislock.New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, "ended", fence.TTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Context().Done():
	case <-ctx.Done():
		t.Fatal("the lease did not end")
	}
	cmd := &cobra.Command{}
	cmd.SetContext(context.Background())
	cmd.SetOut(new(syncBuffer))
	cmd.SetErr(new(syncBuffer))
	ran := filepath.Join(t.TempDir(), "ran")
	err = runHolding(cmd, lease, []string{"touch", ran}, time.Second)
	if _, statErr := os.Stat(ran); statErr == nil {
		t.Error("the command ran with its lease already ended")
	}
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != ExitLeaseLost {
		t.Errorf("runHolding: %v, want exit %d", err, ExitLeaseLost)
	}
}
