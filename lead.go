package fence

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/fencekit/fence/internal/pause"
)

// Defaults of Lead.
const (
	// DefaultCampaignWait is the Wait budget of each Acquire a candidate
	// makes when LeaseOptions gives none: a candidate whose Acquire ran out
	// of budget with the lock held campaigns again at once.
	DefaultCampaignWait = 30 * time.Second
	// DefaultMinBackoff and DefaultMaxBackoff bound the pause before a new
	// campaign after a term ended or Acquire failed; see Backoff.
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 10 * time.Second
)

// MinBackoff is the shortest minimum back-off Backoff accepts. A shorter
// one is most likely a duration without its unit (Backoff(100, 10000) is
// 100 ns to 10 µs), and would have Lead campaign against a failing backend
// many thousand times a second.
const MinBackoff = time.Millisecond

// LeadOption configures Lead.
type LeadOption func(*leadConfig)

type leadConfig struct {
	acquire    []Option
	minBackoff time.Duration
	maxBackoff time.Duration
	onElected  func(Lease)
	onDeposed  func(Lease, error)
}

// LeaseOptions are passed to every Acquire of the campaign: TTL for a fixed
// lease time (fn's lease is then not renewed, and the term ends when it
// expires unless fn extends it), Wait for the budget of each Acquire
// (default DefaultCampaignWait).
func LeaseOptions(opts ...Option) LeadOption {
	return func(c *leadConfig) { c.acquire = append(c.acquire, opts...) }
}

// Backoff sets the bounds of the pause before campaigning again: after the
// n-th term or failed Acquire in a row that did not end by losing the lease,
// the pause is drawn at random between half and all of min·2ⁿ, capped at
// max. A term that ended because the lease was lost is followed by a pause
// of about min, so that another candidate (the one the lock went to) is not
// raced by the deposed leader; so is a term that lasted longer than max,
// which is no early return and ends the row. min must be at least
// MinBackoff (1 ms) and at most max.
func Backoff(min, max time.Duration) LeadOption {
	return func(c *leadConfig) { c.minBackoff, c.maxBackoff = min, max }
}

// OnElected calls f with the lease each time this candidate becomes the
// leader, before fn starts, on Lead's goroutine: who leads is the lease's
// token, since when is the time f is called.
func OnElected(f func(lease Lease)) LeadOption {
	return func(c *leadConfig) { c.onElected = f }
}

// OnDeposed calls f each time a term ends, after fn has returned and the
// lease was released, on Lead's goroutine. err is why: fn's error joined with
// Release's, which matches ErrLeaseLost when the lease was lost during the
// term, and is nil when fn returned nil and the release succeeded.
func OnDeposed(f func(lease Lease, err error)) LeadOption {
	return func(c *leadConfig) { c.onDeposed = f }
}

// Lead campaigns for the lock called name and runs fn while it holds it, as
// Kubernetes' leader election does, on any Locker. It returns only when ctx
// ends, with context.Cause(ctx), or at once with an error matching
// ErrInvalidName or ErrInvalidOption for bad input (a nil ctx, locker or fn
// among it), or once a campaign fails with ErrClosed (the Locker was
// closed: no campaign can succeed). A term whose lease or Release says
// ErrClosed (fn's error does not count) is followed by that campaign at
// once, with no back-off, unless the term before it ended so too.
//
// A campaign is an Acquire with a Wait budget. When it succeeds, a term
// begins: fn runs with the lease and a context that is cancelled when the
// lease ends (its cause is the lease's Err, matching ErrLeaseLost) or when
// ctx ends (ctx's cause, the one given to context.WithCancelCause,
// WithDeadlineCause or WithTimeoutCause if any; see Run). When fn returns,
// the lease is released, the term ends, and after a back-off Lead
// campaigns again. fn must return soon after
// its context is cancelled: Lead waits for it, so a fn that ignores its
// context keeps Lead from returning, and a watchdog lease held, for as long
// as it runs. fn must pass lease.Token() with each write: between the
// moment a lease is lost and the moment fn sees it, another candidate may
// already lead, and only the token lets the resource tell the two apart.
//
// Like client-go's OnStartedLeading, fn is meant to run for the whole term.
// If it returns early — nil or an error — the lease is released and the
// candidate campaigns again after a back-off that grows with each early
// return in a row, as a supervisor restarts a crashed worker; Lead does not
// return. Errors are reported through OnDeposed.
//
// A lease that Acquire returned already ended (see Run) begins no term:
// fn, OnElected and OnDeposed are not called, and Lead campaigns again
// after the pause that follows a lost lease.
//
// A panic in fn or in OnElected goes on up through Lead once the lease is
// released (see Run); one in OnDeposed, after it. Lead does not recover
// them: a candidate that panicked campaigns no more.
//
// When the lock is released normally (ctx of the leader ends), the old
// leader's fn has returned before the lock is released, so the next leader's
// fn starts after it.
func Lead(ctx context.Context, locker Locker, name string, fn func(ctx context.Context, lease Lease) error, opts ...LeadOption) error {
	c := leadConfig{minBackoff: DefaultMinBackoff, maxBackoff: DefaultMaxBackoff}
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	if err := ValidateName(name); err != nil {
		return err
	}
	if locker == nil || fn == nil {
		return fmt.Errorf("%w: Lead with a nil Locker or fn", ErrInvalidOption)
	}
	if ctx == nil {
		return fmt.Errorf("%w: Lead with a nil context", ErrInvalidOption)
	}
	o, err := Apply(c.acquire)
	if err != nil {
		return err
	}
	if c.minBackoff < MinBackoff || c.maxBackoff < c.minBackoff {
		return fmt.Errorf("%w: Lead back-off from %v to %v: want %v <= min <= max", ErrInvalidOption, c.minBackoff, c.maxBackoff, MinBackoff)
	}
	acquire := c.acquire
	if o.Wait == 0 {
		acquire = append(acquire[:len(acquire):len(acquire)], Wait(DefaultCampaignWait))
	}

	failures := 0       // early returns and failed Acquires in a row
	closedTerm := false // the last term ended on a closed client
	for {
		var lease Lease
		var elected time.Time
		var relErr error
		campaign := time.Now()
		err := run(ctx, locker, name, func(ctx context.Context, l Lease) error {
			lease, elected = l, time.Now()
			if c.onElected != nil {
				c.onElected(l)
			}
			return fn(ctx, l)
		}, &relErr, acquire...)
		if lease != nil && c.onDeposed != nil {
			c.onDeposed(lease, err)
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		wasClosed := closedTerm
		closedTerm = false
		switch {
		case lease == nil && errors.Is(err, ErrHeld):
			// Acquire waited its budget: campaign again at once, unless it
			// answered sooner than the minimum back-off (a tiny Wait, or a
			// backend that tries once), which would be a hot loop.
			if d := backoff(c.minBackoff, c.maxBackoff, 0) - time.Since(campaign); d > 0 && !pause.For(ctx, d) {
				return context.Cause(ctx)
			}
			continue
		case lease == nil && (errors.Is(err, ErrInvalidName) || errors.Is(err, ErrInvalidOption) || errors.Is(err, ErrClosed)):
			// Before the lost lease below: a take refused as late on a
			// Locker closed meanwhile matches both, and no campaign can
			// succeed after it (Lead paused first: 2.6 s with a 5 s
			// minimum back-off, TestLeadStopsAtOnceOnLateTakeAfterClose).
			return err
		case lease == nil && (errors.Is(err, errEndedOnArrival) || errors.Is(err, ErrLeaseLost)):
			// Acquire returned a lease already ended (see Run), or
			// refused a take whose reply came past the lease's deadline
			// (the module's backends: an error matching ErrLeaseLost):
			// no term began, but the lock was lost as a deposed
			// leader's is.
			failures = 0
		case lease != nil && !wasClosed && (errors.Is(lease.Err(), ErrClosed) || errors.Is(relErr, ErrClosed)):
			// The term ended on a closed Locker or client: the lease
			// said so, or the Release did (fn's error, which may say so
			// of another Locker of fn's, is no sign). No
			// campaign can succeed, and the next, at once, says so for
			// certain, rather than after a back-off (2.1 to 3.8 s with
			// Backoff(3s, 5s)). Once: a Ring's shard replaced under one
			// call looks closed to that call alone, and a term that
			// ends so again is paused as any other.
			closedTerm = true
			continue
		case lease != nil && (errors.Is(lease.Err(), ErrLeaseLost) || errors.Is(err, ErrLeaseLost)):
			// Lost: the lease's Err says so, or Run's error does when
			// fn's context ended at the lease's Deadline before the
			// Locker noticed (a backend whose Release then freed the
			// lock as its own: the lease's Err says released).
			failures = 0
		case lease != nil && time.Since(elected) > c.maxBackoff:
			// A term longer than the longest pause is no early return: a
			// leader that hands over every hour must not wait the
			// maximum back-off at every handover after a few.
			failures = 0
		default:
			failures++
		}
		if !pause.For(ctx, backoff(c.minBackoff, c.maxBackoff, failures)) {
			return context.Cause(ctx)
		}
	}
}

// backoff returns the jittered pause after n failures in a row: between
// half and all of min·2ⁿ, capped at max.
func backoff(lo, hi time.Duration, n int) time.Duration {
	d := lo
	for i := 0; i < n && d < hi; i++ {
		if d > hi/2 { // doubling would pass hi, or overflow
			d = hi
			break
		}
		d *= 2
	}
	d = min(d, hi)
	return d/2 + rand.N(d/2+1)
}
