package observetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// ExpiryRace says how a backend's test makes a lease's expiry timer fire
// at a moment of its choosing, for CallRacesExpiry.
type ExpiryRace struct {
	// New returns a Locker with obs as its Observer.
	New func(t *testing.T, obs fence.Observer) fence.Locker
	// Soon moves lease's deadline d from now, and its expiry timer with
	// it (a lease acquired with fence.TTL(time.Minute)).
	Soon func(t *testing.T, lease fence.Lease, d time.Duration)
	// Expired is in the error that the expiry timer ends the lease with.
	Expired string
	// For is how long the test tries (default 1 s).
	For time.Duration
}

// CallRacesExpiry acquires leases one after the other, moves each one's
// deadline and expiry timer a few microseconds away, and at once calls
// first ("Err" or "Release"), then Release: whichever of the timer and
// the call ends the lease (both find the deadline passed, or the call
// comes first), it ends once, and its report agrees with what the calls
// returned: Released if Release returned nil (reported before it
// returned), LostExpired with the timer's error if the lease was lost.
func CallRacesExpiry(t *testing.T, r ExpiryRace, first string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if r.For == 0 {
		r.For = time.Second
	}
	rec := &Recorder{}
	l := r.New(t, rec)
	stop := time.Now().Add(r.For)
	counts := map[string]int{}
	var names []string
	for i := 0; time.Now().Before(stop) && !t.Failed(); i++ {
		name := fmt.Sprintf("expiry-race:%s:%s:%d", strings.ReplaceAll(t.Name(), "/", ":"), first, i)
		ls, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
		r.Soon(t, ls, time.Duration(rand.IntN(300))*time.Microsecond)
		var errFirst error
		if first == "Err" {
			errFirst = ls.Err()
		}
		relErr := ls.Release(ctx)
		switch {
		case relErr == nil:
			if errFirst != nil {
				t.Errorf("lease %d: Err = %v, then Release = nil", i, errFirst)
			}
			counts["released"]++
			if e := ends(rec, name); len(e) != 1 || e[0].Cause != fence.Released {
				t.Errorf("lease %d: Release = nil, and the ends reported by then are %+v, want one, released", i, e)
			}
			if err := ls.Err(); !errors.Is(err, fence.ErrReleased) {
				t.Errorf("lease %d: Err after Release = nil is %v, want ErrReleased", i, err)
			}
		case errors.Is(relErr, fence.ErrLeaseLost):
			counts["expired"]++
			if !strings.Contains(relErr.Error(), r.Expired) {
				t.Errorf("lease %d: Release = %v, want the expiry (%q)", i, relErr, r.Expired)
			}
			if errFirst != nil && errFirst.Error() != relErr.Error() {
				t.Errorf("lease %d: Err = %v, then Release = %v", i, errFirst, relErr)
			}
			if err := ls.Err(); err == nil || err.Error() != relErr.Error() {
				t.Errorf("lease %d: Err after Release = %v, want %v", i, err, relErr)
			}
		default:
			t.Fatalf("lease %d: Release = %v", i, relErr)
		}
	}
	// The timer's own report may come a moment after Release returned.
	rec.WaitEnds(t, len(names), 20*time.Second)
	for i, name := range names {
		e := ends(rec, name)
		if len(e) != 1 {
			t.Errorf("lease %d: ends %+v, want one", i, e)
			continue
		}
		if e[0].Cause != fence.Released && (e[0].Cause != fence.LostExpired || !strings.Contains(e[0].Err.Error(), r.Expired)) {
			t.Errorf("lease %d: end %+v, want released or expired", i, e[0])
		}
	}
	if len(rec.Ends()) != len(names) {
		t.Errorf("%d ends reported for %d leases", len(rec.Ends()), len(names))
	}
	t.Logf("%d leases: %v", len(names), counts)
}

// ends returns the ends recorded for the lease called name.
func ends(rec *Recorder, name string) []fence.LeaseEvent {
	var out []fence.LeaseEvent
	for _, e := range rec.Ends() {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// DeadlineFlip says how a backend's test moves a lease's deadline as a
// renewal does, for ReleaseAsDeadlineMoves.
type DeadlineFlip struct {
	// New returns a Locker with obs as its Observer.
	New func(t *testing.T, obs fence.Observer) fence.Locker
	// Set sets lease's deadline to d under the lease's mutex, as a renewal
	// moves it, and keeps its expiry timer from firing before a minute
	// from now (a lease acquired with fence.TTL(time.Minute)).
	Set func(lease fence.Lease, d time.Time)
	// For is how long the test tries (default 1 s).
	For time.Duration
}

// ReleaseAsDeadlineMoves: as redislock's TestReleaseAsDeadlineMovesReportsOnce.
// Release finds the lease past its deadline, or not, at each of its checks,
// while a goroutine moves the deadline back and forth between past and a
// minute ahead, as renewals landing at the deadline would: whichever way
// it goes, the lease's end is reported exactly once by the time Release
// returns, as Released if it returned nil and as an expiry if it returned
// the loss (found at one of its checks).
func ReleaseAsDeadlineMoves(t *testing.T, f DeadlineFlip) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if f.For == 0 {
		f.For = time.Second
	}
	rec := &Recorder{}
	l := f.New(t, rec)
	stop := time.Now().Add(f.For)
	counts := map[string]int{}
	for i := 0; time.Now().Before(stop) && !t.Failed(); i++ {
		name := fmt.Sprintf("deadline-flip:%s:%d", strings.ReplaceAll(t.Name(), "/", ":"), i)
		ls, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		far := time.Now().Add(time.Minute)
		f.Set(ls, far)
		quit, flipped := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(flipped)
			for {
				select {
				case <-quit:
					return
				default:
				}
				f.Set(ls, time.Now().Add(-time.Millisecond))
				f.Set(ls, far)
			}
		}()
		relErr := ls.Release(ctx)
		e := ends(rec, name) // by the time Release returned
		close(quit)
		<-flipped
		switch {
		case relErr == nil:
			counts["released"]++
			if len(e) != 1 || e[0].Cause != fence.Released {
				t.Errorf("lease %d: Release = nil, and the ends reported by then are %+v, want one, released", i, e)
			}
		case errors.Is(relErr, fence.ErrLeaseLost):
			counts["expired"]++
			if len(e) != 1 || e[0].Cause != fence.LostExpired && e[0].Cause != fence.LostRenewFailed {
				t.Errorf("lease %d: Release = %v, and the ends reported by then are %+v, want one, an expiry", i, relErr, e)
			}
		default:
			t.Fatalf("lease %d: Release = %v", i, relErr)
		}
	}
	t.Logf("%v", counts)
}
