package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestReleaseWaitingForKeptRenewal (a helper's attack on 4f0716a; both
// subtests failed on it, and pass with 797bc4e): a watchdog lease
// whose renewal ran in time on Redis, but whose reply is read after the
// lease's deadline (held here by a hook, after go-redis read it: the
// renewal's goroutine descheduled, as on a loaded machine), on a client
// that bounds its own calls (ContextTimeoutEnabled: the renewal's call is
// made straight through, and Release's stop of the watchdog does not cut
// it short, so Release waits for it). The expiry timer is stopped to stand
// for one whose goroutine has not run yet.
//
//   - calledPastDeadline: Release is called once the deadline has passed.
//     Err at that moment says ErrLeaseLost and ends the lease (eba5568:
//     "lost to Err, Context and Release whether or not its expiry timer
//     has run"); Release must say the same. It waits for the watchdog
//     first, the late reply keeps the lease (4f0716a), and Release then
//     returns nil: the answer depends on the client's options and on
//     whether a renewal happened to be in flight.
//   - contextBoundPassed: Release(lease.Context()) is called before the
//     deadline, which passes while it waits for the renewal. Release
//     detached its ctx with the deadline read as it started as the bound
//     (releasectx.Detach); the renewal kept the lease and moved the
//     deadline, but the stale bound has passed by the time Release ends
//     the lease and sends its script: the script is cut short, Release
//     returns an error, and the lock stays held, by nobody, for the
//     renewal's full TTL (the lease ended as released, not given back).
func TestReleaseWaitingForKeptRenewal(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	h := &holdExtendReply{}
	rh := &holdReleaseUntilDone{}
	c.AddHook(h)
	c.AddHook(rh)
	// Loaded first: the hook holds the reply of EVALSHA, which must be the
	// script's run, not NOSCRIPT (the EVAL sent after it would run only
	// once the hold is over, with Release's cancellation).
	for _, s := range []*redis.Script{extendScript, releaseScript} {
		if err := s.Load(context.Background(), c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	other, err := New(srv.Client(t), &Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, variant := range []string{"calledPastDeadline", "contextBoundPassed"} {
		t.Run(variant, func(t *testing.T) {
			h.ran, h.open = make(chan struct{}, 1), make(chan struct{})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := New(c, &Options{WatchdogTTL: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if !l.calls.selfBounded {
				t.Fatal("client not self-bounded")
			}
			name := "late-kept-release:" + variant
			h.armed.Store(true)
			defer h.armed.Store(false)
			fl, err := l.Acquire(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			ls := fl.(*lease)
			select {
			case <-h.ran: // the watchdog's renewal ran on Redis, its reply held
			case <-time.After(10 * time.Second):
				t.Fatal("the watchdog's renewal did not run")
			}
			h.armed.Store(false)
			ls.mu.Lock()
			ls.expiry.Stop() // its goroutine late
			var bound time.Time
			if variant == "calledPastDeadline" {
				ls.setDeadline(time.Now().Add(-time.Millisecond))
			} else {
				bound = time.Now().Add(50 * time.Millisecond)
				ls.setDeadline(bound)
			}
			ls.mu.Unlock()

			relCtx := context.Background()
			if variant == "contextBoundPassed" {
				relCtx = ls.Context()
				rh.armed.Store(true)
				defer rh.armed.Store(false)
			}
			rel := make(chan error, 1)
			go func() { rel <- ls.Release(relCtx) }()
			// Wait until Release has stopped the watchdog and waits for it.
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			giveUp := time.After(10 * time.Second)
			for stopped := false; !stopped; {
				select {
				case <-tick.C:
				case <-giveUp:
					t.Fatal("Release did not stop the watchdog")
				}
				ls.mu.Lock()
				stopped = ls.stopped
				ls.mu.Unlock()
			}
			if !bound.IsZero() {
				<-time.After(time.Until(bound) + time.Millisecond) // the deadline passes as the reply is on its way
			}
			close(h.open)
			var relErr error
			select {
			case relErr = <-rel:
			case <-time.After(20 * time.Second):
				t.Fatal("Release did not return")
			}
			t.Logf("Release = %v; Err = %v", relErr, ls.Err())
			if variant == "calledPastDeadline" && !errors.Is(relErr, fence.ErrLeaseLost) {
				t.Errorf("Release called past the lease's deadline (Err would have said lost) = %v, want ErrLeaseLost", relErr)
			}
			if variant == "contextBoundPassed" && relErr != nil && !errors.Is(relErr, fence.ErrLeaseLost) {
				t.Errorf("Release(lease.Context()) called before the deadline = %v, want nil (or ErrLeaseLost)", relErr)
			}
			// Whatever Release said, nobody holds the lease: the lock must
			// be free (deleted or given back) at once, not at the end of
			// the renewal's TTL.
			var next fence.Lease
			deadline := time.Now().Add(2 * time.Second)
			for {
				next, err = other.Acquire(ctx, name, fence.TTL(time.Second))
				if err == nil || time.Now().After(deadline) {
					break
				}
				select { // a give-back runs in the background
				case <-tick.C:
				case <-ctx.Done():
				}
			}
			if err != nil {
				pttl, _ := srv.Client(t).PTTL(ctx, ls.attempt.acquireKeys[0]).Result()
				t.Errorf("the lock is still held 2 s after Release returned (%v): %v; its PTTL %v", relErr, err, pttl)
			} else {
				_ = next.Release(ctx)
			}
		})
	}
}

// holdReleaseUntilDone holds the release script, when armed, until its
// context ends (at most 2 s): a round trip that takes longer than the
// goroutine that cancels a detached context past its bound.
type holdReleaseUntilDone struct{ armed atomic.Bool }

func (h *holdReleaseUntilDone) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdReleaseUntilDone) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.hold(ctx, cmd)
		}
		return next(ctx, cmds)
	}
}
func (h *holdReleaseUntilDone) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.hold(ctx, cmd)
		return next(ctx, cmd)
	}
}

func (h *holdReleaseUntilDone) hold(ctx context.Context, cmd redis.Cmder) {
	if a := cmd.Args(); len(a) < 2 || fmt.Sprint(a[1]) != releaseScript.Hash() || !h.armed.Load() {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
	}
}
