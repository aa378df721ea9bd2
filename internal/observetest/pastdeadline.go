package observetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// PastDeadline says how a backend's internal test makes a lease that is
// past its deadline while its expiry timer still waits (a minute away),
// for ReentryAtEndPastDeadline.
type PastDeadline struct {
	// New returns a Locker whose watchdog leases last a minute, with obs
	// as its Observer, or log as its Logger (one of them is nil).
	New func(t *testing.T, obs fence.Observer, log *slog.Logger) fence.Locker
	// Pass moves lease's deadline into the past, leaving its expiry timer
	// as it is; it fails t if the lease has no timer.
	Pass func(t *testing.T, lease fence.Lease)
	// Triggers are the calls that find the lease past its deadline: any
	// of "Err", "Context", "Done", "Release", "Extend", and "Close" (the
	// Locker's Close(ctx)).
	Triggers []string
}

// ReentryAtEndPastDeadline checks, for an Observer and for a Logger's
// handler, on fixed-TTL and watchdog leases, and for each trigger: the
// trigger ends a lease past its deadline before its timer ran, and the
// callback, which calls the lease back (Extend, Release twice, Err,
// Context, Done), neither deadlocks on the caller that made the report nor
// gets anything but the loss; the end is reported once, as an expiry
// (renew_failed for a watchdog lease).
func ReentryAtEndPastDeadline(t *testing.T, p PastDeadline) {
	for _, logged := range []bool{false, true} {
		for _, watchdog := range []bool{false, true} {
			for _, trigger := range p.Triggers {
				name := fmt.Sprintf("logged=%v/watchdog=%v/%s", logged, watchdog, trigger)
				t.Run(name, func(t *testing.T) {
					reentryAtEnd(t, p, name, logged, watchdog, trigger)
				})
			}
		}
	}
}

func reentryAtEnd(t *testing.T, p PastDeadline, name string, logged, watchdog bool, trigger string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := NewReentry()
	var l fence.Locker
	if logged {
		l = p.New(t, nil, slog.New(r.Handler()))
	} else {
		l = p.New(t, r, nil)
	}
	var acq []fence.Option
	if !watchdog {
		acq = append(acq, fence.TTL(time.Minute))
	}
	ls, err := l.Acquire(ctx, "past-deadline:"+strings.ReplaceAll(name, "/", ":"), acq...)
	if err != nil {
		t.Fatal(err)
	}
	r.Set(ls)
	p.Pass(t, ls)
	trig := make(chan error, 1)
	go func() {
		switch trigger {
		case "Err":
			trig <- ls.Err()
		case "Context":
			trig <- context.Cause(ls.Context())
		case "Done":
			<-ls.Done()
			trig <- ls.Err()
		case "Release":
			trig <- ls.Release(ctx)
		case "Extend":
			trig <- ls.Extend(ctx, time.Minute)
		case "Close":
			if err := l.(interface{ Close(context.Context) error }).Close(ctx); err != nil {
				trig <- err
				return
			}
			trig <- ls.Err()
		default:
			trig <- fmt.Errorf("unknown trigger %q", trigger)
		}
	}()
	var got error
	select {
	case got = <-trig:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s on a lease past its deadline did not return in 20 s (deadlock?):\n%s", trigger, Stacks())
	}
	if !errors.Is(got, fence.ErrLeaseLost) {
		t.Errorf("%s = %v, want ErrLeaseLost", trigger, got)
	}
	res := r.Calls(t, 20*time.Second)
	for what, e := range map[string]error{"Extend": res.Extend, "Release": res.Release, "second Release": res.Again, "Err": res.Err, "Context's cause": res.ContextCause} {
		if !errors.Is(e, fence.ErrLeaseLost) {
			t.Errorf("%s from the callback = %v, want ErrLeaseLost", what, e)
		}
	}
	if !res.DoneClosed {
		t.Error("Done not closed in the callback")
	}
	if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release after all = %v, want ErrLeaseLost", err)
	}
	if !logged {
		want := fence.LostExpired
		if watchdog {
			want = fence.LostRenewFailed
		}
		if ends := r.Ends(); len(ends) != 1 || ends[0].Cause != want {
			t.Errorf("reported ends %+v, want one, %s", ends, want)
		}
	}
}

// PastDeadlineCase is one case of PastDeadlineEnds.
type PastDeadlineCase struct {
	// New returns a Locker whose watchdog leases last a minute, with obs
	// as its Observer.
	New func(t *testing.T, obs fence.Observer) fence.Locker
	// Pass is PastDeadline's: it moves the lease's deadline into the past,
	// leaving its expiry timer (a minute away) as it is.
	Pass func(t *testing.T, lease fence.Lease)
	// Watchdog: the lease is acquired without fence.TTL; otherwise with
	// fence.TTL(time.Minute).
	Watchdog bool
	// First is the call that finds the lease past its deadline: "Err",
	// "Context", "Done", "Release" or "Extend".
	First string
	// Expired and NotRenewed are in the error that the expiry timer ends
	// a fixed-TTL lease and a watchdog lease with.
	Expired, NotRenewed string
}

// PastDeadlineEnds checks that a lease past its deadline, whose expiry
// timer has not run yet, ends as that timer would end it, at the first
// call of c.First: it returns an error matching fence.ErrLeaseLost
// (Done is closed at once), and by the time it returns the Observer has
// been told of one end, fence.LostExpired (fence.LostRenewFailed for a
// watchdog lease) with the timer's error. Err, Context, Done, Extend and
// Release then agree, and nothing more is reported (not a Released).
func PastDeadlineEnds(t *testing.T, c PastDeadlineCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := &Recorder{}
	l := c.New(t, rec)
	var acq []fence.Option
	cause, text := fence.LostExpired, c.Expired
	if c.Watchdog {
		cause, text = fence.LostRenewFailed, c.NotRenewed
	} else {
		acq = append(acq, fence.TTL(time.Minute))
	}
	ls, err := l.Acquire(ctx, "past-deadline:"+strings.ReplaceAll(t.Name(), "/", ":"), acq...)
	if err != nil {
		t.Fatal(err)
	}
	c.Pass(t, ls)
	var got error
	switch c.First {
	case "Err":
		got = ls.Err()
	case "Context":
		lctx := ls.Context()
		if lctx.Err() == nil {
			t.Error("Context not cancelled after the deadline, before the timer ran")
		}
		got = context.Cause(lctx)
	case "Done":
		select {
		case <-ls.Done():
		default:
			t.Error("Done not closed after the deadline, before the timer ran")
		}
		got = ls.Err()
	case "Release":
		got = ls.Release(ctx)
	case "Extend":
		got = ls.Extend(ctx, time.Minute)
	default:
		t.Fatalf("unknown call %q", c.First)
	}
	if !errors.Is(got, fence.ErrLeaseLost) {
		t.Errorf("%s after the deadline, before the timer ran = %v, want ErrLeaseLost", c.First, got)
	}
	// Reported by the call that ended the lease, before it returned.
	ends := rec.Ends()
	if len(ends) != 1 || ends[0].Cause != cause || ends[0].Err == nil || !strings.Contains(ends[0].Err.Error(), text) {
		t.Errorf("ends reported by the time %s returned: %+v; want one, %s, with an error saying %q", c.First, ends, cause, text)
	}
	if err := ls.Err(); !errors.Is(err, fence.ErrLeaseLost) || !strings.Contains(err.Error(), text) {
		t.Errorf("Err after %s = %v, want ErrLeaseLost saying %q", c.First, err, text)
	}
	select {
	case <-ls.Done():
	default:
		t.Errorf("Done not closed after %s", c.First)
	}
	if cause := context.Cause(ls.Context()); !errors.Is(cause, fence.ErrLeaseLost) {
		t.Errorf("Context's cause after %s = %v, want ErrLeaseLost", c.First, cause)
	}
	if err := ls.Extend(ctx, time.Minute); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Extend after %s = %v, want ErrLeaseLost", c.First, err)
	}
	if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release after %s = %v, want ErrLeaseLost", c.First, err)
	}
	if err := ls.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Err after Release = %v, want ErrLeaseLost", err)
	}
	if ends := rec.Ends(); len(ends) != 1 {
		t.Errorf("ends reported in all: %+v, want one", ends)
	}
}
