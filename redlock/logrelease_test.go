package redlock_test

import (
	"context"
	"log/slog"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// A Logger's handler releases the lease when the watchdog logs that a
// renewal failed (two of three nodes gone): that Release must not wait for
// the watchdog, which is inside the handler. Before the fix it waited for
// ever (Release waits for the watchdog without a context).
func TestLoggerReleasesOnRenewalFailed(t *testing.T) {
	srvs := nodes(t, 3)
	h := observetest.NewReleaser("renewal failed")
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: 3 * time.Second, NodeTimeout: generous, Logger: slog.New(h)})
	lease, err := l.Acquire(ctxFor(t), "log-release")
	if err != nil {
		t.Fatal(err)
	}
	h.Set(lease)
	srvs[0].Kill()
	srvs[1].Kill()
	h.AwaitEnded(t, 10*time.Second)
}

// sentHook signals on sent each command it sees once armed.
type sentHook struct {
	armed atomic.Bool
	sent  chan struct{}
}

func (h *sentHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *sentHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() {
			select {
			case h.sent <- struct{}{}:
			default:
			}
		}
		return next(ctx, cmd)
	}
}
func (h *sentHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.armed.Load() {
			select {
			case h.sent <- struct{}{}:
			default:
			}
		}
		return next(ctx, cmds)
	}
}

// The holder's Release stops the watchdog while its renewal waits for two
// paused nodes: the renewal cut short is no failure to log. Were it logged,
// a handler that releases on "renewal failed" would wait for the Release
// under way (relOp), which waits for the watchdog inside the handler.
// Before the fix the holder's Release never returned.
func TestReleaseCutsRenewalShortNotLogged(t *testing.T) {
	srvs := nodes(t, 3)
	hook := &sentHook{sent: make(chan struct{}, 1)}
	cs := clientsWith(t, srvs, redis.Options{}, nil, nil, hook)
	h := observetest.NewReleaser("renewal failed")
	l, err := redlock.New(cs, &redlock.Options{WatchdogTTL: 3 * time.Second, NodeTimeout: generous, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t), "cut-short")
	if err != nil {
		t.Fatal(err)
	}
	h.Set(lease)
	srvs[0].Signal(syscall.SIGSTOP)
	srvs[1].Signal(syscall.SIGSTOP)
	t.Cleanup(func() { srvs[0].Signal(syscall.SIGCONT); srvs[1].Signal(syscall.SIGCONT) })
	hook.armed.Store(true)
	select {
	case <-hook.sent: // the watchdog's renewal is out, waiting for nodes 0 and 1
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal sent within 10s")
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- lease.Release(ctx)
	}()
	select {
	case err := <-done:
		t.Logf("Release: %v", err)
	case <-time.After(15 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("Release did not return within 15s (deadlock?); goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}
	if h.Called() {
		t.Errorf("the renewal that Release cut short was logged as failed")
	}
}
