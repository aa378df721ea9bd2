package redlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestReentryAtEndPastDeadline: the end of a lease past its deadline, before
// its expiry timer ran, is reported synchronously by whichever call finds
// it (Err, Context, Done or Release: b49970e; Close, which calls Err on each lease it holds). A LeaseEnded callback (or a
// Logger's handler told "lease lost") that calls the lease back must not
// deadlock on the caller that made the report; see
// observetest.ReentryAtEndPastDeadline. Before b49970e an Observer (or a
// Logger, or a call of Done), which gives the lease its timer, changed the
// answers: in the gap before the timer's goroutine ran, Err said the lease
// was held and Release deleted the lock and answered nil (reported
// Released), where the same lease without an Observer answers ErrLeaseLost.
func TestReentryAtEndPastDeadline(t *testing.T) {
	clients := threeNodes(t)
	observetest.ReentryAtEndPastDeadline(t, observetest.PastDeadline{
		New: func(t *testing.T, obs fence.Observer, log *slog.Logger) fence.Locker {
			l, err := New(clients, &Options{WatchdogTTL: time.Minute, Observer: obs, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			return l
		},
		Pass:     passDeadline,
		Triggers: []string{"Err", "Context", "Done", "Release", "Close"},
	})
}

// passDeadline moves the deadline of fl, a lease with an expiry timer, a
// millisecond into the past, the timer still waiting for the old one: the
// gap before the timer's goroutine runs.
func passDeadline(t *testing.T, fl fence.Lease) {
	t.Helper()
	ls := fl.(*lease)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.expiry == nil {
		t.Fatal("the lease has no expiry timer")
	}
	ls.deadline = time.Now().Add(-time.Millisecond)
}

// TestExtendPastDeadlineBeforeTimerReportsExpiry: b49970e makes Err, Context and
// Release end a lease past its deadline before its timer ran, but Extend
// still checks it with expiredLocked, which ends only a lease without a
// timer. An observed lease in that gap so has its Extend sent to every
// node, refused there as late, and ends as LostRenewLate ("removed or
// taken by another owner on 0 of 3 nodes, and 3 renewals reached their
// node after the lease's deadline"), where the same lease unobserved
// answers the expiry at once, sending nothing, and redislock's Extend
// (which calls Err) reports LostExpired.
// It failed before 16e55a2 (cause renew_late; the error said another
// owner).
func TestExtendPastDeadlineBeforeTimerReportsExpiry(t *testing.T) {
	clients := threeNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := observetest.NewReentry()
	l, err := New(clients, &Options{Observer: r})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close(ctx) }()
	fl, err := l.Acquire(ctx, "deadline-gap:extend-gap", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ls := fl.(*lease)
	passDeadline(t, ls)
	err = ls.Extend(ctx, time.Minute)
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend after the deadline = %v, want ErrLeaseLost", err)
	}
	if strings.Contains(err.Error(), "another owner") {
		t.Errorf("Extend after the deadline = %v: want the expiry, not a loss to another owner", err)
	}
	if ends := r.Ends(); len(ends) != 1 || ends[0].Cause != fence.LostExpired {
		t.Errorf("reported ends %+v, want one, LostExpired", ends)
	}
}

// TestReleaseAsDeadlineMovesReportsOnce: redislock's race (a renewal
// moving the deadline between the due check and the end) ported: redlock's
// Release checks and ends under one hold of ls.mu (dueLocked), so every
// Release's end must be reported once by the time it returns.
func TestReleaseAsDeadlineMovesReportsOnce(t *testing.T) {
	clients := threeNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rec := &observetest.Recorder{}
	l, err := New(clients, &Options{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close(ctx) }()
	stopAt := time.Now().Add(time.Second)
	var missing, expired, released int
	for i := 0; time.Now().Before(stopAt) && missing == 0; i++ {
		fl, err := l.Acquire(ctx, fmt.Sprintf("deadline-gap:race:%d", i), fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		ls := fl.(*lease)
		before := len(rec.Ends())
		stop := make(chan struct{})
		flipped := make(chan struct{})
		go func() {
			defer close(flipped)
			far := time.Now().Add(time.Minute)
			for {
				select {
				case <-stop:
					return
				default:
				}
				ls.mu.Lock()
				ls.deadline = time.Now().Add(-time.Millisecond)
				ls.mu.Unlock()
				ls.mu.Lock()
				ls.deadline = far
				ls.mu.Unlock()
			}
		}()
		relErr := ls.Release(context.Background())
		close(stop)
		<-flipped
		n := len(rec.Ends()) - before
		switch {
		case relErr == nil:
			released++
		case errors.Is(relErr, fence.ErrLeaseLost):
			expired++
		default:
			t.Fatalf("Release = %v", relErr)
		}
		if n != 1 {
			missing++
			t.Errorf("lease %d: Release returned %v (Err %v) and %d ends were reported by then, want 1", i, relErr, ls.Err(), n)
		}
	}
	t.Logf("released %d, expired %d, unreported %d", released, expired, missing)
}

// TestRenewalReadPastDeadlineKeepsLease: a renewal that every node ran in
// time (before the lease's deadline on its clock) but whose replies are
// read after the local deadline, with nothing looking at the lease
// meanwhile. The lock was held throughout, and Extend returns nil with
// the new Deadline, whether or not the lease has an expiry timer (an
// Observer gives it one): before, a lease without one was ended by the
// renewal's last check, and Extend returned the expiry, while an observed
// one was kept (found by a helper's attack, TestAttack1RenewalReadPastDeadline,
// which wanted the end for both; TestExpiryFiringAsRenewalLandsKeepsLease
// wants the lease kept). The deadline's passing while the replies are out
// is made by moving it back once every node has run the script.
func TestRenewalReadPastDeadlineKeepsLease(t *testing.T) {
	h := &holdExtendReply{}
	var clients []redis.UniversalClient
	for range 3 {
		c := redistest.Start(t).Client(t)
		c.AddHook(h)
		clients = append(clients, c)
	}
	for _, observed := range []bool{false, true} {
		t.Run(fmt.Sprintf("observed=%v", observed), func(t *testing.T) {
			h.ran, h.open = make(chan struct{}, 3), make(chan struct{})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rec := &observetest.Recorder{}
			opts := &Options{}
			if observed {
				opts.Observer = rec
			}
			l, err := New(clients, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = l.Close(ctx) }()
			fl, err := l.Acquire(ctx, fmt.Sprintf("deadline-gap:renew-late-read:%v", observed), fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			ls := fl.(*lease)
			if err := ls.Extend(ctx, time.Minute); err != nil { // loads the script: the one held runs at once
				t.Fatal(err)
			}
			h.armed.Store(true)
			defer h.armed.Store(false)
			ext := make(chan error, 1)
			go func() { ext <- ls.Extend(ctx, time.Minute) }()
			for range 3 {
				select {
				case <-h.ran:
				case <-time.After(10 * time.Second):
					t.Fatal("the extend script did not run on every node")
				}
			}
			ls.mu.Lock()
			ls.deadline = time.Now().Add(-time.Millisecond) // passed while the replies are out
			ls.mu.Unlock()
			close(h.open)
			if err := <-ext; err != nil {
				t.Errorf("Extend run in time on every node, its replies read after the deadline = %v, want nil", err)
			}
			if e := ls.Err(); e != nil {
				t.Errorf("Err after it = %v, want nil", e)
			}
			if d := time.Until(ls.Deadline()); d < 30*time.Second {
				t.Errorf("Deadline in %v after Extend(1m)", d)
			}
			if ends := rec.Ends(); len(ends) != 0 {
				t.Errorf("ends reported %+v, want none", ends)
			}
			if err := ls.Release(ctx); err != nil {
				t.Errorf("Release = %v", err)
			}
		})
	}
}

// holdExtendReply is a hook on a node's client that, when armed, lets the
// extend script run and holds its reply until open is closed, telling ran.
type holdExtendReply struct {
	armed     atomic.Bool
	ran, open chan struct{}
}

func (h *holdExtendReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdExtendReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *holdExtendReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) < 2 || fmt.Sprint(a[1]) != extendScript.Hash() || !h.armed.Load() {
			return next(ctx, cmd)
		}
		err := next(ctx, cmd)
		if err == nil { // ran: not refused as NOSCRIPT
			h.ran <- struct{}{}
			<-h.open
		}
		return err
	}
}

// threeNodes starts three independent redis-servers and returns a client
// of each.
func threeNodes(t *testing.T) []redis.UniversalClient {
	var clients []redis.UniversalClient
	for range 3 {
		clients = append(clients, redistest.Start(t).Client(t))
	}
	return clients
}
