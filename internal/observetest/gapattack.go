package observetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// GapAttack says how a backend's test makes a lease that is past its
// deadline while its expiry timer (or run) still waits, for the attack
// checks below.
type GapAttack struct {
	// New returns a Locker whose watchdog leases last a minute, with obs
	// as its Observer, and whose expiry timers are held as PastDeadline's.
	New func(t *testing.T, obs fence.Observer) fence.Locker
	// Pass is PastDeadline's: it moves a held lease's deadline into the
	// past, leaving its expiry timer (a minute away) as it is.
	Pass func(t *testing.T, lease fence.Lease)
	// Set sets the deadline of a lease, held or ended, to d, as a
	// renewal would, leaving its timer as it is (for a lease that has
	// ended, Pass may refuse).
	Set func(lease fence.Lease, d time.Time)
	// Rounds is how many leases ConcurrentCallsPastDeadline tries
	// (default 30).
	Rounds int
}

// gapCall makes one of the calls that find a lease past its deadline and
// returns what it says of the lease.
func gapCall(ctx context.Context, ls fence.Lease, call string) error {
	switch call {
	case "Err":
		return ls.Err()
	case "Done":
		<-ls.Done()
		return ls.Err()
	case "Context":
		return context.Cause(ls.Context())
	case "Release":
		return ls.Release(ctx)
	case "Extend":
		return ls.Extend(ctx, time.Minute)
	}
	return fmt.Errorf("unknown call %q", call)
}

// ConcurrentCallsPastDeadline: a lease past its deadline, its expiry timer
// still waiting, is called at once from eight goroutines (Err, Done,
// Context, Release, Extend, and Err, Release and Done again), while the
// Observer, told of the end, calls the lease back (Extend, Release twice,
// Err, Context, Done; see Reentry). None of them deadlocks; each says the
// lease was lost, the Err, Done and Context callers with the same error;
// and by the time they have all returned (the one that ended the lease
// has, and it reports before it returns) exactly one end has been
// reported, as an expiry (renew_failed for a watchdog lease). Repeated
// over g.Rounds leases.
func ConcurrentCallsPastDeadline(t *testing.T, g GapAttack, watchdog bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := NewReentry()
	l := g.New(t, r)
	rounds := g.Rounds
	if rounds == 0 {
		rounds = 30
	}
	want := fence.LostExpired
	var acq []fence.Option
	if watchdog {
		want = fence.LostRenewFailed
	} else {
		acq = append(acq, fence.TTL(time.Minute))
	}
	calls := []string{"Err", "Done", "Context", "Release", "Extend", "Err", "Release", "Done"}
	for i := 0; i < rounds && !t.Failed(); i++ {
		name := fmt.Sprintf("gap-concurrent:%s:%d", strings.ReplaceAll(t.Name(), "/", ":"), i)
		ls, err := l.Acquire(ctx, name, acq...)
		if err != nil {
			t.Fatal(err)
		}
		r.Set(ls)
		g.Pass(t, ls)
		start := make(chan struct{})
		got := make([]error, len(calls))
		var wg sync.WaitGroup
		for j, call := range calls {
			wg.Go(func() {
				<-start
				got[j] = gapCall(ctx, ls, call)
			})
		}
		all := make(chan struct{})
		go func() { wg.Wait(); close(all) }()
		close(start)
		select {
		case <-all:
		case <-time.After(30 * time.Second):
			t.Fatalf("lease %d: the concurrent calls past its deadline did not return in 30 s (deadlock?):\n%s", i, Stacks())
		}
		ends := endsOf(r.Ends(), name) // all returned: the one that ended it reported first
		if len(ends) != 1 || ends[0].Cause != want {
			t.Errorf("lease %d: ends reported once every call returned: %+v, want one, %s", i, ends, want)
		}
		var seen error
		for j, call := range calls {
			if !errors.Is(got[j], fence.ErrLeaseLost) {
				t.Errorf("lease %d: %s past the deadline, called concurrently = %v, want ErrLeaseLost", i, call, got[j])
				continue
			}
			if call == "Release" || call == "Extend" {
				continue
			}
			if seen == nil {
				seen = got[j]
			} else if got[j].Error() != seen.Error() {
				t.Errorf("lease %d: %s says %v, another call %v", i, call, got[j], seen)
			}
		}
		res := r.Calls(t, 20*time.Second)
		for what, e := range map[string]error{"Extend": res.Extend, "Release": res.Release, "second Release": res.Again, "Err": res.Err, "Context's cause": res.ContextCause} {
			if !errors.Is(e, fence.ErrLeaseLost) {
				t.Errorf("lease %d: %s from the callback = %v, want ErrLeaseLost", i, what, e)
			}
		}
		if !res.DoneClosed {
			t.Errorf("lease %d: Done not closed in the callback", i)
		}
		if ends := endsOf(r.Ends(), name); len(ends) != 1 {
			t.Errorf("lease %d: ends reported after the callback: %+v, want one", i, ends)
		}
	}
}

func endsOf(all []fence.LeaseEvent, name string) []fence.LeaseEvent {
	var out []fence.LeaseEvent
	for _, e := range all {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// HeldLeaseCallsDoNotAllocate: Err, Done, Context and Deadline, which now
// read the clock and take the lease's mutex to end a lease past its
// deadline, allocate nothing on a held lease (Done and Context are read in
// hot loops: a select on Done in every iteration of a worker).
func HeldLeaseCallsDoNotAllocate(t *testing.T, g GapAttack) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := g.New(t, &Recorder{})
	ls, err := l.Acquire(ctx, "gap-allocs:"+strings.ReplaceAll(t.Name(), "/", ":"), fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	_ = ls.Done() // Done's channel is made at its first call
	held := true
	allocs := testing.AllocsPerRun(1000, func() {
		select {
		case <-ls.Done():
			held = false
		default:
		}
		if ls.Err() != nil || ls.Context().Err() != nil || ls.Deadline().IsZero() {
			held = false
		}
	})
	if !held {
		t.Fatalf("the lease ended during the check: %v", ls.Err())
	}
	if allocs != 0 {
		t.Errorf("Err, Done, Context and Deadline on a held lease: %v allocations a round, want 0", allocs)
	}
	if err := ls.Release(ctx); err != nil {
		t.Errorf("Release = %v", err)
	}
}

// ReleasedThenPastDeadline: a lease whose Release concluded (nil), or
// failed on a done ctx, has ended as released; its old deadline passing
// afterwards must not turn it into an expiry: Err still returns
// fence.ErrReleased (or the loss a later Release found), Extend an error
// matching both fence.ErrLeaseLost and fence.ErrReleased, a later Release
// nil or the loss, and exactly one end is reported, Released.
func ReleasedThenPastDeadline(t *testing.T, g GapAttack, failFirst bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := &Recorder{}
	l := g.New(t, rec)
	name := "gap-released:" + strings.ReplaceAll(t.Name(), "/", ":")
	ls, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	relCtx := ctx
	if failFirst {
		c, cancel := context.WithCancel(ctx)
		cancel()
		relCtx = c
	}
	first := ls.Release(relCtx)
	if !failFirst && first != nil {
		t.Fatalf("Release = %v", first)
	}
	if errors.Is(first, fence.ErrLeaseLost) {
		t.Fatalf("Release with a done ctx = %v: lost", first)
	}
	g.Set(ls, time.Now().Add(-time.Millisecond))
	if err := ls.Err(); !errors.Is(err, fence.ErrReleased) {
		t.Errorf("Err after Release (%v), then the old deadline passed = %v, want ErrReleased", first, err)
	}
	if cause := context.Cause(ls.Context()); !errors.Is(cause, fence.ErrReleased) {
		t.Errorf("Context's cause = %v, want ErrReleased", cause)
	}
	if err := ls.Extend(ctx, time.Minute); !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
		t.Errorf("Extend = %v, want ErrLeaseLost and ErrReleased", err)
	}
	again := ls.Release(ctx)
	if again != nil && !errors.Is(again, fence.ErrLeaseLost) {
		t.Errorf("Release again, past the old deadline = %v, want nil or the loss", again)
	}
	if first == nil && again != nil {
		t.Errorf("Release again after one that returned nil = %v, want nil", again)
	}
	if err := ls.Err(); !errors.Is(err, fence.ErrReleased) && (again == nil || err == nil || err.Error() != again.Error()) {
		t.Errorf("Err after the second Release (%v) = %v, want ErrReleased or that loss", again, err)
	}
	if e := endsOf(rec.Ends(), name); len(e) != 1 || e[0].Cause != fence.Released {
		t.Errorf("ends reported %+v, want one, released", e)
	}
}

// FailedRenewalCall is a slog.Handler that, at the first record whose
// message contains Msg (a watchdog's failed renewal) once a lease is Set,
// moves that lease past its deadline with Pass and calls Call on it ("Err",
// "Done", "Context", "Release" or "Extend"), as a handler that looks at the
// lease when told a renewal failed: the call, made on the watchdog's
// goroutine, ends the lease and reports it there, and the Observer's
// callback may call the lease back. Result returns what Call returned.
type FailedRenewalCall struct {
	Msg, Call string
	Pass      func(fence.Lease)
	mu        sync.Mutex
	lease     fence.Lease
	result    chan error
}

// NewFailedRenewalCall returns a FailedRenewalCall with no lease yet.
func NewFailedRenewalCall(msg, call string, pass func(fence.Lease)) *FailedRenewalCall {
	return &FailedRenewalCall{Msg: msg, Call: call, Pass: pass, result: make(chan error, 1)}
}

// Set makes lease the one called at the next failed renewal.
func (h *FailedRenewalCall) Set(lease fence.Lease) { h.mu.Lock(); h.lease = lease; h.mu.Unlock() }

func (h *FailedRenewalCall) Enabled(context.Context, slog.Level) bool { return true }
func (h *FailedRenewalCall) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *FailedRenewalCall) WithGroup(string) slog.Handler            { return h }

// Handle makes the call at the first failed renewal.
func (h *FailedRenewalCall) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, h.Msg) {
		return nil
	}
	h.mu.Lock()
	ls := h.lease
	h.lease = nil
	h.mu.Unlock()
	if ls == nil {
		return nil
	}
	h.Pass(ls)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h.result <- gapCall(ctx, ls, h.Call)
	return nil
}

// Result waits up to limit for the call, and fails t with every
// goroutine's stack if it has not returned (a deadlock).
func (h *FailedRenewalCall) Result(t testing.TB, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-h.result:
		return err
	case <-time.After(limit):
		t.Fatalf("%s from the handler of a failed renewal did not return within %v (deadlock?); goroutines:\n%s", h.Call, limit, Stacks())
		return nil
	}
}

// CallAtFailedRenewal: see FailedRenewalCall. newLocker returns a Locker
// with obs as its Observer and log as its Logger whose watchdog leases are
// renewed within a few seconds, and whose renewals fail. The call from the
// handler returns the loss, so do the Observer's calls back (see Reentry),
// none deadlocks, and one end is reported, renew_failed.
func CallAtFailedRenewal(t *testing.T, msg, call string, newLocker func(t *testing.T, obs fence.Observer, log *slog.Logger) fence.Locker, pass func(fence.Lease)) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := NewReentry()
	h := NewFailedRenewalCall(msg, call, pass)
	l := newLocker(t, r, slog.New(h))
	ls, err := l.Acquire(ctx, "gap-failed-renewal:"+strings.ReplaceAll(t.Name(), "/", ":"))
	if err != nil {
		t.Fatal(err)
	}
	r.Set(ls)
	h.Set(ls)
	if err := h.Result(t, 20*time.Second); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("%s from the handler of a failed renewal, past the deadline = %v, want ErrLeaseLost", call, err)
	}
	res := r.Calls(t, 20*time.Second)
	for what, e := range map[string]error{"Extend": res.Extend, "Release": res.Release, "second Release": res.Again, "Err": res.Err, "Context's cause": res.ContextCause} {
		if !errors.Is(e, fence.ErrLeaseLost) {
			t.Errorf("%s from the Observer's callback = %v, want ErrLeaseLost", what, e)
		}
	}
	if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release after all = %v, want ErrLeaseLost", err)
	}
	if ends := r.Ends(); len(ends) != 1 || ends[0].Cause != fence.LostRenewFailed {
		t.Errorf("ends reported %+v, want one, renew_failed", ends)
	}
}
