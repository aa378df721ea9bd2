// Package fencetest is the conformance suite that every fence.Locker passes,
// so that all backends behave the same to their users.
//
// A backend's test calls Run with a Config that builds its Locker against
// its real backend (a real server; memlock's is memory). Nothing in the
// suite assumes a particular backend:
//
//	func TestConformance(t *testing.T) {
//		fencetest.Run(t, fencetest.Config{New: ..., Remove: ..., WatchdogTTL: 300 * time.Millisecond})
//	}
package fencetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// Config describes the Locker under test.
type Config struct {
	// New returns a Locker whose leases without fence.TTL are renewed by a
	// watchdog with lease time WatchdogTTL. Each call may return a new
	// Locker sharing the same locks (on the same server, say); clean-up
	// goes in t.Cleanup.
	New func(t testing.TB) fence.Locker

	// Remove deletes the lock record of name behind its holder's back, as
	// an operator or a failover would.
	Remove func(t testing.TB, name string)

	// WatchdogTTL is the lease time of watchdog leases from New. Keep it
	// short (a few hundred milliseconds) so the suite runs quickly.
	WatchdogTTL time.Duration

	// Slack is how much later than its wait budget Acquire may return.
	// Default 1 s, for noisy machines.
	Slack time.Duration

	// SessionBound, if set, is how far past the backend's last reply a
	// lease's Deadline may lie whatever its lease time: a lease that lives
	// no longer than a session (ZooKeeper's) keeps its Deadline within the
	// session timeout of the last contact. ExtendKeepsToken then requires
	// Extend to move the Deadline, within that bound, and the lease to
	// outlive its first lease time, rather than a Deadline a whole
	// extension away.
	SessionBound time.Duration

	// ShortLeaseMayFail declares that the backend times an acquisition
	// against its lease time and refuses one that used it up (Redlock's
	// validity check; redislock, pglock, etcdlock and zklock refuse a take
	// whose reply came past the lease's deadline: with fence.MinTTL, 7.9 ms
	// left after the drift allowance, which round trips on a loaded machine
	// can take).
	// InvalidInput then accepts a refused Acquire of fence.MinTTL, as
	// long as the error matches fence.ErrNotAcquired and not
	// fence.ErrInvalidOption (MinTTL is a valid lease time), and checks
	// Extend's validation on a longer lease instead. Without it, that
	// Acquire must succeed.
	ShortLeaseMayFail bool

	// NewObserved, if set, is New with obs as the Locker's Observer. The
	// suite then checks that an Observer may call the lease's Release and
	// Extend from LeaseEnded, whichever goroutine ends the lease, without
	// a deadlock.
	NewObserved func(t testing.TB, obs fence.Observer) fence.Locker

	// NewLogged, if set, is New with log as the Locker's Logger, checked
	// alike: a handler that calls Release when told the lease was lost.
	NewLogged func(t testing.TB, log *slog.Logger) fence.Locker

	// NewClosable, if set, is New on a client of the Locker's own, with a
	// func that closes that client, as a program shutting down does. The
	// suite then checks that once it is closed, Acquire fails at once with
	// an error matching fence.ErrClosed (no lease can ever be granted
	// again), so that fence.Lead stops campaigning and returns, and that a
	// leader's fn is told its term ended.
	NewClosable func(t testing.TB) (l fence.Locker, closeClient func())

	// ClosedLeaseLost declares that closing the client ends a held lease
	// as lost before the Locker can tell that the client was closed
	// (ZooKeeper: closing the connection closes its session, whose
	// ephemeral node goes first), so that the lease's Err does not match
	// fence.ErrClosed. ClosedClient then lets fence.Lead pause after the
	// term, as after any lost lease, before the campaign that says the
	// client was closed. Without it, the lease's end must match
	// fence.ErrClosed, and Lead must campaign at once.
	ClosedLeaseLost bool

	_ struct{}
}

// Run runs the suite as subtests of t. New, Remove and WatchdogTTL are
// required: without one, Run fails t at once, naming it.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	// A Config missing what every subtest uses failed confusingly: a nil
	// New or Remove panicked in a subtest (ending the whole test binary),
	// and a zero WatchdogTTL made waits of zero that failed as if the
	// backend were broken.
	switch {
	case cfg.New == nil:
		t.Fatal("fencetest: Config.New is nil: the suite needs it to make Lockers")
	case cfg.Remove == nil:
		t.Fatal("fencetest: Config.Remove is nil: the suite needs it to delete a lock behind its holder's back")
	case cfg.WatchdogTTL < fence.MinTTL:
		t.Fatalf("fencetest: Config.WatchdogTTL %v: set it to the lease time of New's watchdog leases (a few hundred milliseconds), at least fence.MinTTL", cfg.WatchdogTTL)
	}
	if cfg.Slack == 0 {
		cfg.Slack = time.Second
	}
	s := suite{cfg}
	t.Run("MutualExclusion", s.mutualExclusion)
	t.Run("TokensIncreaseAfterRelease", s.tokensAfterRelease)
	t.Run("ExpiryFreesTheLock", s.expiry)
	t.Run("ExtendAfterExpiry", s.extendAfterExpiry)
	t.Run("WaitBudget", s.waitBudget)
	t.Run("WaitLongerThanLeaseTime", s.waitLongerThanLease)
	t.Run("ContextCancelWhileWaiting", s.cancelWhileWaiting)
	t.Run("CancelledContext", s.cancelledContext)
	t.Run("AcquireCancelledMidCall", s.acquireCancelledMidCall)
	t.Run("WatchdogKeepsLease", s.watchdog)
	t.Run("LeaseLostWhenRemoved", s.lostWhenRemoved)
	t.Run("LeaseLostWhenTaken", s.lostWhenTaken)
	t.Run("ReleaseIdempotent", s.releaseIdempotent)
	t.Run("ReleaseWithDoneContext", s.releaseDoneContext)
	t.Run("ReleaseWithDoneContextEndsLease", s.releaseDoneEndsLease)
	t.Run("ReleaseCancelledMidCall", s.releaseCancelledMidCall)
	t.Run("ReleaseWithDoneContextTwice", s.releaseDoneTwice)
	t.Run("ReleaseWithLeaseContext", s.releaseLeaseContext)
	t.Run("ReleaseWithExpiredLeaseContext", s.expiredLeaseContext)
	t.Run("ExtendKeepsToken", s.extend)
	t.Run("ExtendRacesRelease", s.extendRacesRelease)
	t.Run("ExtendCancelledMidCall", s.extendCancelledMidCall)
	t.Run("ReleaseRacesWatchdog", s.releaseRacesWatchdog)
	t.Run("CancelRacesHandoff", s.cancelRacesHandoff)
	t.Run("BudgetEndRacesHandoff", s.budgetEndRacesHandoff)
	t.Run("InvalidInput", s.invalidInput)
	t.Run("NilContext", s.nilContext)
	t.Run("HugeTTL", s.hugeTTL)
	t.Run("Run", s.run)
	t.Run("Reentry", s.reentry)
	t.Run("Reports", s.reports)
	if cfg.NewClosable != nil {
		t.Run("ClosedClient", s.closedClient)
		t.Run("ClosedClientLease", s.closedClientLease)
	}
}

type suite struct{ cfg Config }

// name returns a lock name unique to the running test.
func name(t testing.TB) string {
	return "fencetest:" + strings.ReplaceAll(t.Name(), "/", ":")
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mustAcquire acquires name on l with opts, within ctxFor(t), or fails t.
// A backend gives a lease back rather than hand it over when the reply
// that took the lock came past the lease's deadline (ErrLeaseLost), which a
// loaded machine's scheduling delays can cause with the suite's short
// leases: in CI, redislock's reply came 240 ms after the try of a 200 ms
// lease, and 311 ms after the try of a 300 ms watchdog lease. The suite
// then tries again, five times at most. Only a reply that could be late
// is: an Acquire that gives its lease back before most of the lease time
// (opts' TTL, or the watchdog's) has passed since it was called gave back
// a lease whose reply came in time, a bug the retry must not hide. The bar is 0.8 of the lease
// time: a backend may count the deadline from before the call (etcdlock
// from its spare etcd lease's grant, up to a tenth of the lease time
// earlier) and less its drift allowance. An Acquire that waits (fence.Wait)
// is not tried again: the backend takes a late reply's give-back in its
// stride within the wait budget, and the time since the call, the wait in
// it, says nothing of when the reply came.
func (s suite) mustAcquire(t testing.TB, l fence.Locker, name string, opts ...fence.Option) fence.Lease {
	t.Helper()
	return s.mustAcquireCtx(t, nil, l, name, opts...)
}

// mustAcquireCtx is mustAcquire with ctx for every try (nil: ctxFor(t)).
func (s suite) mustAcquireCtx(t testing.TB, ctx context.Context, l fence.Locker, name string, opts ...fence.Option) fence.Lease {
	t.Helper()
	ttl, waits := s.cfg.WatchdogTTL, false
	if o, err := fence.Apply(opts); err == nil {
		if o.TTL != 0 {
			ttl = o.TTL
		}
		waits = o.Wait > 0
	}
	for try := 1; ; try++ {
		tctx := ctx
		if tctx == nil {
			tctx = ctxFor(t)
		}
		called := time.Now()
		lease, err := l.Acquire(tctx, name, opts...)
		took := time.Since(called)
		switch {
		case err == nil:
			if lease.Token() <= 0 {
				t.Fatalf("Acquire(%q): token %d, want > 0", name, lease.Token())
			}
			return lease
		case !errors.Is(err, fence.ErrLeaseLost) || waits || try == 5:
			t.Fatalf("Acquire(%q), lease time %v, try %d: %v", name, ttl, try, err)
		case took < ttl-ttl/5:
			t.Fatalf("Acquire(%q), lease time %v, try %d: %v, %v after it was called: the reply could not have come past the lease's deadline", name, ttl, try, err, took.Round(time.Millisecond))
		}
		t.Logf("Acquire(%q), lease time %v: %v; trying again", name, ttl, err)
	}
}

func mustRelease(t testing.TB, lease fence.Lease) {
	t.Helper()
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release(%q): %v", lease.Name(), err)
	}
}

// waitDone waits for the lease to end, failing the test after limit.
func waitDone(t testing.TB, lease fence.Lease, limit time.Duration) {
	t.Helper()
	select {
	case <-lease.Done():
	case <-time.After(limit):
		t.Fatalf("lease %q still held %v later, want ended", lease.Name(), limit)
	}
}

// mutualExclusion: goroutines on two Lockers take turns; never two inside,
// and a lease is granted only once its predecessor has ended: a Release ends
// its lease before it frees the lock (another Acquire may take it at once,
// while the releasing call still waits for its reply).
func (s suite) mutualExclusion(t *testing.T) {
	lockers := []fence.Locker{s.cfg.New(t), s.cfg.New(t)}
	n := name(t)
	const workers, rounds = 8, 10
	var inside atomic.Int32
	var mu sync.Mutex
	var tokens []fence.Token
	var last fence.Lease
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range rounds {
				lease, err := lockers[w%2].Acquire(ctxFor(t), n, fence.Wait(20*time.Second), fence.TTL(10*time.Second))
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				if c := inside.Add(1); c != 1 {
					t.Errorf("%d holders inside at once", c)
				}
				mu.Lock()
				if last != nil && last.Err() == nil {
					t.Errorf("token %d granted while the lease of token %d, being released, has no Err", lease.Token(), last.Token())
				}
				tokens = append(tokens, lease.Token())
				last = lease
				mu.Unlock()
				inside.Add(-1)
				if err := lease.Release(ctxFor(t)); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if len(tokens) != workers*rounds {
		t.Fatalf("%d acquisitions, want %d", len(tokens), workers*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d at acquisition %d is not greater than %d before it", tokens[i], i, tokens[i-1])
		}
	}
}

func (s suite) tokensAfterRelease(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	var last fence.Token
	for i := range 5 {
		lease := s.mustAcquire(t, l, n, fence.TTL(10*time.Second))
		if lease.Token() <= last {
			t.Fatalf("acquisition %d: token %d, want > %d", i, lease.Token(), last)
		}
		last = lease.Token()
		mustRelease(t, lease)
	}
}

func (s suite) expiry(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	a := s.mustAcquire(t, l, n, fence.TTL(200*time.Millisecond))
	b := s.mustAcquire(t, l, n, fence.Wait(10*time.Second), fence.TTL(10*time.Second))
	granted := time.Now()
	defer mustRelease(t, b)
	if b.Token() <= a.Token() {
		t.Fatalf("token after expiry %d, want > %d", b.Token(), a.Token())
	}
	// Deadline is when a is known to be held until: the lock cannot have
	// gone to b before it (a backend's Deadline errs early).
	if d := a.Deadline(); d.After(granted) {
		t.Fatalf("the lock went to another lease %v before the expired lease's Deadline", d.Sub(granted))
	}
	// And a ends by then, give or take Slack: its owner must stop once the
	// lock may be another's.
	waitDone(t, a, max(time.Until(a.Deadline()), 0)+s.cfg.Slack)
	if !errors.Is(a.Err(), fence.ErrLeaseLost) {
		t.Fatalf("expired lease Err() = %v, want ErrLeaseLost", a.Err())
	}
	if time.Now().Before(a.Deadline()) {
		t.Fatalf("expired lease ended before its deadline %v", a.Deadline())
	}
	if err := a.Extend(ctxFor(t), time.Minute); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend of expired lease = %v, want ErrLeaseLost", err)
	}
	if err := a.Release(ctxFor(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of expired lease = %v, want ErrLeaseLost", err)
	}
	// The expired lease's Release must not have deleted b's lock.
	if _, err := l.Acquire(ctxFor(t), n); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire after stale Release = %v, want ErrHeld", err)
	}
}

// expiredLeaseContext: a Release given the Context of a lease that has
// expired (cancelled with the expiry as its cause, not by a release)
// returns promptly, the lease lost, and the lock is free or soon is.
func (s suite) expiredLeaseContext(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	a := s.mustAcquire(t, l, n, fence.TTL(200*time.Millisecond))
	actx := a.Context()
	waitDone(t, a, time.Until(a.Deadline())+s.cfg.Slack)
	done := make(chan error, 1)
	go func() { done <- a.Release(actx) }()
	select {
	case err := <-done:
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Errorf("Release(Context()) of an expired lease = %v, want ErrLeaseLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Release(Context()) of an expired lease still running after 5 s")
	}
	if cause := context.Cause(actx); !errors.Is(cause, fence.ErrLeaseLost) {
		t.Errorf("expired lease's Context cause %v after Release, want ErrLeaseLost", cause)
	}
	b := s.mustAcquire(t, l, n, fence.Wait(10*time.Second), fence.TTL(10*time.Second))
	mustRelease(t, b)
}

// freeAfterGiveUp releases holder, after Acquires that gave up waiting for
// it, and checks that the lock is free: an Acquire that gave up must not
// keep its place in line (a queued key or node not deleted), or the lock
// goes to it and is held for no one.
func (s suite) freeAfterGiveUp(t *testing.T, l fence.Locker, holder fence.Lease) {
	t.Helper()
	mustRelease(t, holder)
	next, err := s.cfg.New(t).Acquire(ctxFor(t), holder.Name(), fence.Wait(s.cfg.Slack), fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("the lock is not free %v after its holder's Release, with only Acquires that gave up waiting for it: %v", s.cfg.Slack, err)
	}
	mustRelease(t, next)
}

func (s suite) waitBudget(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	holder := s.mustAcquire(t, l, n, fence.TTL(30*time.Second))
	defer s.freeAfterGiveUp(t, l, holder)
	for _, budget := range []time.Duration{0, 300 * time.Millisecond} {
		start := time.Now()
		_, err := l.Acquire(ctxFor(t), n, fence.Wait(budget))
		took := time.Since(start)
		if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, fence.ErrHeld) {
			t.Fatalf("Acquire(wait %v) = %v, want ErrNotAcquired and ErrHeld", budget, err)
		}
		if took < budget || took > budget+s.cfg.Slack {
			t.Fatalf("Acquire(wait %v) returned after %v", budget, took)
		}
	}
}

// waitLongerThanLease: an Acquire that waited longer than a lease time
// for a watchdog lease gets a lease that holds, the late-reply deadline
// counted from the try that took the lock, not from the call. A backend
// that counted it from the call gave back every lease it waited a lease
// time for (ErrLeaseLost), as if its reply had come late. The waiter has
// waited 1.5 lease times at least when the holder lets go: a second
// caller, asked after it, gives up its own wait of 1.5 lease times first.
// The lease's Deadline, read as Acquire returns, lies ahead: a backend
// that counted the Deadline from the call returned a lease past it, which
// its watchdog's first tick ended a third of a lease time later, after
// the suite had released it (fencetest's wait-deadline-stale).
func (s suite) waitLongerThanLease(t *testing.T) {
	n := name(t)
	ttl := s.cfg.WatchdogTTL
	holder := s.mustAcquire(t, s.cfg.New(t), n)
	waiter := s.cfg.New(t)
	calling := make(chan struct{})
	type result struct {
		lease    fence.Lease
		err      error
		deadline time.Time // the lease's, as Acquire returned
		returned time.Time
	}
	got := make(chan result, 1)
	go func() {
		close(calling)
		r := result{}
		r.lease, r.err = waiter.Acquire(ctxFor(t), n, fence.Wait(3*ttl+s.cfg.Slack))
		if r.err == nil {
			r.deadline, r.returned = r.lease.Deadline(), time.Now()
		}
		got <- r
	}()
	<-calling
	if _, err := s.cfg.New(t).Acquire(ctxFor(t), n, fence.Wait(ttl+ttl/2)); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire(wait %v) while a watchdog lease is held = %v, want ErrHeld", ttl+ttl/2, err)
	}
	mustRelease(t, holder)
	r := <-got
	if r.err != nil {
		t.Fatalf("Acquire that waited more than a lease time (%v) = %v, want a lease", ttl, r.err)
	}
	if err := r.lease.Err(); err != nil {
		t.Fatalf("the lease of an Acquire that waited more than a lease time ended: %v", err)
	}
	if !r.deadline.After(r.returned) {
		_ = r.lease.Release(ctxFor(t))
		t.Fatalf("an Acquire that waited more than a lease time (%v) returned a lease whose Deadline had passed %v before", ttl, r.returned.Sub(r.deadline).Round(time.Millisecond))
	}
	mustRelease(t, r.lease)
}

func (s suite) cancelWhileWaiting(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	holder := s.mustAcquire(t, l, n, fence.TTL(30*time.Second))
	defer s.freeAfterGiveUp(t, l, holder)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.Acquire(ctx, n, fence.Wait(time.Minute))
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with expiring ctx = %v, want ErrNotAcquired and context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 300*time.Millisecond+s.cfg.Slack {
		t.Fatalf("Acquire returned %v after its ctx expired", took)
	}
}

func (s suite) cancelledContext(t *testing.T) {
	l := s.cfg.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := l.Acquire(ctx, name(t))
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with cancelled ctx = %v, want ErrNotAcquired and context.Canceled", err)
	}
}

// watchdog: a lease without TTL is renewed for as long as it is held, also
// once the context given to Acquire (a request's, say) has ended: the
// lease carries its values, not its cancellation.
func (s suite) watchdog(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	actx, cancel := context.WithCancel(ctxFor(t))
	lease := s.mustAcquireCtx(t, actx, l, n)
	cancel()
	first := lease.Deadline()
	// Another caller waits three lease times for it, in vain.
	_, err := s.cfg.New(t).Acquire(ctxFor(t), n, fence.Wait(3*s.cfg.WatchdogTTL))
	if !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire while watchdog lease held = %v, want ErrHeld (the lease: Err %v, Deadline in %v)", err, lease.Err(), time.Until(lease.Deadline()))
	}
	if lease.Err() != nil {
		t.Fatalf("watchdog lease ended: %v", lease.Err())
	}
	if !lease.Deadline().After(first) {
		t.Fatalf("deadline did not move: %v", first)
	}
	if err := lease.Context().Err(); err != nil {
		t.Fatalf("the lease's Context ended with the ctx given to Acquire: %v", err)
	}
	mustRelease(t, lease)
}

func (s suite) lostWhenRemoved(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n)
	token := lease.Token()
	s.cfg.Remove(t, n)
	waitDone(t, lease, 5*s.cfg.WatchdogTTL)
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", lease.Err())
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, fence.ErrLeaseLost) {
		t.Fatalf("context cause = %v, want ErrLeaseLost", cause)
	}
	if err := lease.Release(ctxFor(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
	if lease.Token() != token {
		t.Fatalf("token changed from %d to %d", token, lease.Token())
	}
}

func (s suite) lostWhenTaken(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	a := s.mustAcquire(t, l, n)
	s.cfg.Remove(t, n)
	b := s.mustAcquire(t, s.cfg.New(t), n, fence.TTL(30*time.Second))
	defer mustRelease(t, b)
	waitDone(t, a, 5*s.cfg.WatchdogTTL)
	if err := a.Extend(ctxFor(t), time.Minute); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend of taken lease = %v, want ErrLeaseLost", err)
	}
	if err := a.Release(ctxFor(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of taken lease = %v, want ErrLeaseLost", err)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("new holder's token %d, want > %d", b.Token(), a.Token())
	}
	if _, err := l.Acquire(ctxFor(t), n); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("the lost lease's Release freed the new holder's lock: Acquire = %v", err)
	}
}

func (s suite) releaseIdempotent(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n)
	mustRelease(t, lease)
	mustRelease(t, lease)
	select {
	case <-lease.Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	if !errors.Is(lease.Err(), fence.ErrReleased) {
		t.Fatalf("Err() after Release = %v, want ErrReleased", lease.Err())
	}
	// The lock is no longer this lease's: Extend says so as the Lease
	// contract asks (ErrLeaseLost), and why (ErrReleased).
	if err := lease.Extend(ctxFor(t), time.Minute); !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("Extend after Release = %v, want an error matching ErrLeaseLost and ErrReleased", err)
	}
	// The lock is free again at once.
	mustRelease(t, s.mustAcquire(t, l, n))
}

// releaseDoneContext: a Release whose context is already done (a request's
// context in a deferred Release, the usual careless call) may fail, but the
// watchdog must not go on renewing a lease its owner gave up: the lock is
// free within the watchdog TTL, and calling Release again is harmless.
func (s suite) releaseDoneContext(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	t.Logf("Release with a done context: %v; the lock must be free within %v", lease.Release(done), 2*s.cfg.WatchdogTTL+s.cfg.Slack)
	b := s.mustAcquire(t, s.cfg.New(t), n, fence.Wait(2*s.cfg.WatchdogTTL+s.cfg.Slack))
	if err := lease.Release(ctxFor(t)); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release again = %v, want nil or ErrLeaseLost", err)
	}
	if err := b.Err(); err != nil {
		t.Fatalf("the old lease's second Release ended the new holder's lease: %v", err)
	}
	mustRelease(t, b)
}

// releaseDoneEndsLease: a Release whose context is already done ends the
// lease at once all the same, as every Release does before its request
// goes out: Err matches ErrReleased, Done is closed, and Context is
// cancelled with ErrReleased, so that work under the lease's Context stops
// as it would after a Release that got through (a careless deferred
// Release(r.Context()) after the client went away must not leave it
// running for the whole lease time on one backend and stop it at once on
// another). Release returns nil or ctx's error; Extend cannot revive the
// lease; a Release retried with a live ctx frees the lock at once (or
// finds it gone, if the first one got through after all).
func (s suite) releaseDoneEndsLease(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n, fence.TTL(time.Minute))
	done, cancel := context.WithCancel(context.Background())
	cancel()
	relErr := lease.Release(done)
	if relErr != nil && !errors.Is(relErr, context.Canceled) {
		t.Errorf("Release(done ctx) = %v, want nil or an error matching context.Canceled", relErr)
	}
	if err := lease.Err(); !errors.Is(err, fence.ErrReleased) {
		t.Errorf("after Release(done ctx) = %v: Err %v, want ErrReleased", relErr, err)
	}
	select {
	case <-lease.Done():
	default:
		t.Errorf("after Release(done ctx) = %v: Done is open", relErr)
	}
	if lctx := lease.Context(); lctx.Err() == nil || !errors.Is(context.Cause(lctx), fence.ErrReleased) {
		t.Errorf("after Release(done ctx) = %v: Context Err %v, cause %v; want cancelled with ErrReleased", relErr, lctx.Err(), context.Cause(lctx))
	}
	if err := lease.Extend(ctxFor(t), time.Minute); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Extend after Release(done ctx) = %v, want ErrLeaseLost", err)
	}
	if err := lease.Release(ctxFor(t)); err != nil && (relErr == nil || !errors.Is(err, fence.ErrLeaseLost)) {
		t.Fatalf("Release(done ctx) = %v, then Release retried = %v", relErr, err)
	}
	next, err := s.cfg.New(t).Acquire(ctxFor(t), n, fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Release(done ctx) = %v, then a retried Release: the lock is not free: %v", relErr, err)
	}
	mustRelease(t, next)
}

// releaseLeaseContext: a Release given a context that the lease's end
// cancels (the lease's own Context, or the one Run gives fn, cancelled when
// the lease ends) frees the lock and returns nil. The lease ends as Release
// starts, before the request that frees the lock leaves: that end must not
// cancel the request, or the lock stays held, by nobody, until it expires
// (and Run's retry may find it gone, its first delete having run, and
// report the lease lost).
func (s suite) releaseLeaseContext(t *testing.T) {
	l, other := s.cfg.New(t), s.cfg.New(t)
	n := name(t)
	free := func(how string) {
		t.Helper()
		next, err := other.Acquire(ctxFor(t), n, fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("after %s: the lock is not free: %v", how, err)
		}
		mustRelease(t, next)
	}
	for range 5 {
		lease := s.mustAcquire(t, l, n, fence.TTL(time.Minute))
		if err := lease.Release(lease.Context()); err != nil {
			t.Fatalf("Release(lease.Context()) = %v", err)
		}
		free("Release(lease.Context())")
	}
	for range 5 {
		var relErr error
		err := fence.Run(ctxFor(t), l, n, func(ctx context.Context, lease fence.Lease) error {
			relErr = lease.Release(ctx)
			return nil
		}, fence.TTL(time.Minute))
		if relErr != nil || err != nil {
			t.Fatalf("Release of fn's context in Run = %v; Run = %v", relErr, err)
		}
		free("Release in Run's fn")
	}
	// A Release that failed (a done ctx) has ended the lease, and
	// cancelled its Context; calling Release again retries, also with
	// that Context, which must not cut the retry short.
	for range 3 {
		lease := s.mustAcquire(t, l, n, fence.TTL(time.Minute))
		lctx := lease.Context()
		done, cancel := context.WithCancel(context.Background())
		cancel()
		first := lease.Release(done)
		if err := lease.Release(lctx); err != nil && (first == nil || !errors.Is(err, fence.ErrLeaseLost)) {
			t.Fatalf("Release(done ctx) = %v, then Release(lease.Context()) = %v", first, err)
		}
		free("a Release retried with lease.Context()")
	}
	for range 3 {
		var first, retry error
		err := fence.Run(ctxFor(t), l, n, func(ctx context.Context, lease fence.Lease) error {
			done, cancel := context.WithCancel(context.Background())
			cancel()
			first = lease.Release(done)
			if lease.Err() != nil {
				<-ctx.Done() // cancelled by the lease's end, as the retry starts
			}
			retry = lease.Release(ctx)
			return nil
		}, fence.TTL(time.Minute))
		if retry != nil && (first == nil || !errors.Is(retry, fence.ErrLeaseLost)) {
			t.Fatalf("in Run's fn: Release(done ctx) = %v, then Release(fn's ctx) = %v; Run = %v", first, retry, err)
		}
		free("a Release retried with Run's fn's ctx")
	}
}

func (s suite) extend(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n, fence.TTL(time.Second))
	before, token := lease.Deadline(), lease.Token()
	if err := lease.Extend(ctxFor(t), time.Minute); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if lease.Token() != token {
		t.Fatalf("Extend changed the token from %d to %d", token, lease.Token())
	}
	if bound := s.cfg.SessionBound; bound > 0 {
		if d := lease.Deadline(); !d.After(before) || d.After(time.Now().Add(bound)) {
			t.Fatalf("deadline %v after Extend(1m), was %v, want later and within %v", d, before, bound)
		}
	} else if !lease.Deadline().After(before.Add(30 * time.Second)) {
		t.Fatalf("deadline %v after Extend(1m), was %v", lease.Deadline(), before)
	}
	// The extended lease, and its lock, outlive the first lease time: an
	// Extend that moved Deadline but not the lock's expiry would let
	// another owner in while the lease says it is held.
	other, err := s.cfg.New(t).Acquire(ctxFor(t), n, fence.Wait(time.Until(before)+time.Second/2))
	if err == nil {
		_ = other.Release(ctxFor(t))
		t.Fatalf("another Acquire took the lock at the lease's first lease time despite Extend(1m) (lease Err %v, Deadline in %v)", lease.Err(), time.Until(lease.Deadline()))
	}
	if !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("another Acquire waiting past the first lease time = %v, want ErrHeld", err)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("lease ended at its first lease time despite Extend(1m): %v", err)
	}
	if err := lease.Extend(ctxFor(t), 0); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("Extend(0) = %v, want ErrInvalidOption", err)
	}
	mustRelease(t, lease)
	if err := lease.Extend(ctxFor(t), time.Minute); err == nil {
		t.Fatal("Extend after Release succeeded")
	}
}

func (s suite) invalidInput(t *testing.T) {
	l := s.cfg.New(t)
	for _, bad := range []string{"", "a{b", "a}b", "tab\there", "nul\x00", "\xff", strings.Repeat("x", fence.MaxNameLen+1)} {
		if _, err := l.Acquire(ctxFor(t), bad); !errors.Is(err, fence.ErrInvalidName) {
			t.Errorf("Acquire(%q) = %v, want ErrInvalidName", bad, err)
		}
	}
	for _, tc := range []struct {
		what string
		opt  fence.Option
	}{
		{"TTL(0)", fence.TTL(0)},
		{"TTL(-1s)", fence.TTL(-time.Second)},
		{"TTL(1µs)", fence.TTL(time.Microsecond)},
		{"TTL(1ms)", fence.TTL(time.Millisecond)},
		{"TTL(MinTTL-1ns)", fence.TTL(fence.MinTTL - 1)},
		{"Wait(-1s)", fence.Wait(-time.Second)},
	} {
		if _, err := l.Acquire(ctxFor(t), name(t), tc.opt); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("Acquire with %s = %v, want ErrInvalidOption", tc.what, err)
		}
	}
	// The shortest lease accepted is one its holder can use: its deadline
	// lies after the request was sent.
	start := time.Now()
	lease, err := l.Acquire(ctxFor(t), name(t), fence.TTL(fence.MinTTL))
	switch {
	case err == nil:
		if !lease.Deadline().After(start) {
			t.Errorf("lease of MinTTL %v: deadline %v is before Acquire began", fence.MinTTL, lease.Deadline().Sub(start))
		}
	case errors.Is(err, fence.ErrInvalidOption):
		t.Fatalf("Acquire with TTL(MinTTL) = %v, want a valid lease time", err)
	case s.cfg.ShortLeaseMayFail && errors.Is(err, fence.ErrNotAcquired):
		// Refused for timing, which the backend declared it may be.
		t.Logf("Acquire with TTL(MinTTL) refused for timing, as the backend may: %v", err)
		lease = s.mustAcquire(t, l, name(t), fence.TTL(10*time.Second))
	default:
		t.Fatalf("Acquire with TTL(MinTTL): %v", err)
	}
	if lease.Token() <= 0 {
		t.Fatalf("token %d, want > 0", lease.Token())
	}
	if err := lease.Extend(ctxFor(t), fence.MinTTL-1); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("Extend(MinTTL-1ns) = %v, want ErrInvalidOption", err)
	}
	if err := lease.Release(ctxFor(t)); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of a MinTTL lease = %v", err)
	}
}

// valueKey keys the value that run puts in Run's ctx.
type valueKey struct{}

func (s suite) run(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	var token fence.Token
	// The lease's Context carries the values of the ctx given to Acquire
	// (a trace, a request id), and so does fn's, its child.
	vctx := context.WithValue(ctxFor(t), valueKey{}, "v")
	err := fence.Run(vctx, l, n, func(ctx context.Context, lease fence.Lease) error {
		token = lease.Token()
		if v := lease.Context().Value(valueKey{}); v != "v" {
			t.Errorf("the lease's Context has value %v, want the one of Acquire's ctx", v)
		}
		if v := ctx.Value(valueKey{}); v != "v" {
			t.Errorf("fn's ctx has value %v, want the one of Run's ctx", v)
		}
		return nil
	}, fence.TTL(10*time.Second))
	if err != nil || token <= 0 {
		t.Fatalf("Run = %v with token %d", err, token)
	}
	// fn's error comes back; the lock is released either way.
	boom := errors.New("boom")
	err = fence.Run(ctxFor(t), l, n, func(context.Context, fence.Lease) error { return boom }, fence.TTL(10*time.Second))
	if !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want fn's error", err)
	}
	// fn's ctx reads the lease's Deadline whenever it is asked whether it is
	// done, and a Locker may ask it while it holds a lock of its own
	// (memlock's Extend did): the lease's Deadline must never block. A
	// Locker that deadlocks so would hang Run for ever; it is left behind.
	ran := make(chan error, 1)
	go func() {
		ran <- fence.Run(ctxFor(t), l, n, func(ctx context.Context, lease fence.Lease) error {
			return lease.Extend(ctx, 10*time.Second)
		}, fence.TTL(10*time.Second))
	}()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run, Extend with fn's ctx: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run whose fn extends its lease with fn's ctx did not return in 30 s: does the lease's Deadline wait for a lock that Extend holds while it asks ctx whether it is done?")
	}
	// A lease lost while fn runs cancels fn's ctx and surfaces as ErrLeaseLost.
	// (A watchdog lease given back for a late reply, as mustAcquire allows
	// for, fails Run with ErrLeaseLost before fn runs: Run is tried again.)
	fnRan := false
	for try := 1; !fnRan && try <= 5; try++ {
		err = fence.Run(ctxFor(t), l, n, func(ctx context.Context, lease fence.Lease) error {
			fnRan = true
			s.cfg.Remove(t, n)
			select {
			case <-ctx.Done():
				return fmt.Errorf("stopped: %w", context.Cause(ctx))
			case <-time.After(5 * s.cfg.WatchdogTTL):
				return errors.New("fn's ctx not cancelled after the lock was removed")
			}
		})
		if !fnRan && !errors.Is(err, fence.ErrLeaseLost) {
			break
		}
	}
	if !fnRan {
		t.Fatalf("Run's fn never ran: %v", err)
	}
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Run with lost lease = %v, want ErrLeaseLost", err)
	}
}

// closedBackoff is Lead's least back-off in closedClient: longer than the
// subtest's limit, so that a Lead that pauses after the closed term fails.
const closedBackoff = time.Minute

// closedClient closes the Locker's client under a leader: its fn must be
// told (its lease cannot be kept), Lead must return an error matching
// fence.ErrClosed rather than campaign on for as long as its ctx lasts,
// without a back-off after the term (the lease's Err or its Release says
// the client was closed), and Acquire must fail at once, saying so.
func (s suite) closedClient(t *testing.T) {
	l, closeClient := s.cfg.NewClosable(t)
	n := name(t)
	ctx := ctxFor(t)
	backoff := closedBackoff
	if s.cfg.ClosedLeaseLost {
		backoff = 10 * time.Millisecond
	}
	elected := make(chan struct{})
	var once sync.Once
	deposed := make(chan error, 1)
	led := make(chan error, 1)
	go func() {
		led <- fence.Lead(ctx, l, n, func(ctx context.Context, lease fence.Lease) error {
			once.Do(func() { close(elected) })
			<-ctx.Done()
			select {
			case deposed <- context.Cause(ctx):
			default:
			}
			return nil
		}, fence.Backoff(backoff, 2*backoff), fence.LeaseOptions(fence.Wait(time.Second)))
	}()
	select {
	case <-elected:
	case err := <-led:
		t.Fatalf("Lead = %v before it was elected", err)
	case <-ctx.Done():
		t.Fatal("not elected")
	}
	closeClient()
	closed := time.Now()
	defer func() { t.Logf("Lead returned %v after the close", time.Since(closed)) }()
	// The term ends by the lease's Deadline at the latest: the watchdog
	// cannot renew it.
	limit := 5*s.cfg.WatchdogTTL + s.cfg.Slack
	if s.cfg.SessionBound > 0 {
		limit = 2*s.cfg.SessionBound + s.cfg.Slack
	}
	select {
	case err := <-led:
		if !errors.Is(err, fence.ErrClosed) {
			t.Fatalf("Lead on a closed client = %v, want an error matching fence.ErrClosed", err)
		}
	case <-time.After(limit):
		t.Fatalf("Lead on a closed client still running %v after the close (want it to return an error matching fence.ErrClosed)", limit)
	}
	select {
	case cause := <-deposed:
		if !s.cfg.ClosedLeaseLost && !errors.Is(cause, fence.ErrClosed) {
			t.Errorf("fn's context ended with %v, want an error matching fence.ErrClosed (the lease cannot be kept)", cause)
		}
	default:
		t.Fatal("Lead returned, its fn still running")
	}
	start := time.Now()
	lease, err := l.Acquire(ctxFor(t), n+":after", fence.Wait(5*time.Second))
	if err == nil {
		_ = lease.Release(ctxFor(t))
		t.Fatal("Acquire on a closed client: acquired")
	}
	if !errors.Is(err, fence.ErrClosed) || !errors.Is(err, fence.ErrNotAcquired) {
		t.Errorf("Acquire on a closed client = %v, want an error matching fence.ErrClosed and fence.ErrNotAcquired", err)
	}
	if took := time.Since(start); took > s.cfg.Slack {
		t.Errorf("Acquire with a 5 s wait budget on a closed client took %v: want it to fail at once", took)
	}
}

// hugeTTL: a lease time too long for the backend (the largest Duration)
// is refused, or granted with a Deadline far ahead; never one whose
// Deadline wrapped into the past, nor a lock that expires at once. The
// same for Extend.
func (s suite) hugeTTL(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	check := func(what string, lease fence.Lease) {
		t.Helper()
		if d := time.Until(lease.Deadline()); d < time.Hour && s.cfg.SessionBound == 0 {
			t.Errorf("%s: Deadline in %v, want far ahead", what, d)
		}
		if err := lease.Err(); err != nil {
			t.Errorf("%s: lease ended: %v", what, err)
		}
		if _, err := s.cfg.New(t).Acquire(ctxFor(t), n); !errors.Is(err, fence.ErrHeld) {
			t.Errorf("%s: another Acquire = %v, want ErrHeld", what, err)
		}
	}
	for _, ttl := range []time.Duration{100 * 365 * 24 * time.Hour, math.MaxInt64} {
		lease, err := l.Acquire(ctxFor(t), n, fence.TTL(ttl))
		if err != nil {
			if !errors.Is(err, fence.ErrInvalidOption) && !errors.Is(err, fence.ErrNotAcquired) {
				t.Errorf("Acquire with TTL(%v) = %v, want a lease or a refusal", ttl, err)
			}
			t.Logf("Acquire with TTL(%v) refused: %v", ttl, err)
		} else {
			check(fmt.Sprintf("TTL(%v)", ttl), lease)
			mustRelease(t, lease)
		}
		lease = s.mustAcquire(t, l, n, fence.TTL(10*time.Second))
		if err := lease.Extend(ctxFor(t), ttl); err != nil {
			t.Logf("Extend(%v) refused: %v", ttl, err)
			if errors.Is(err, fence.ErrLeaseLost) {
				t.Errorf("Extend(%v) = %v, the lease not lost", ttl, err)
			}
		} else {
			check(fmt.Sprintf("Extend(%v)", ttl), lease)
		}
		mustRelease(t, lease)
	}
}
