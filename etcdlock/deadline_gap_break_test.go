package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/observetest"
	"google.golang.org/grpc"
)

// pastDeadlineLocker is a Locker on the shared server whose watchdog
// leases last a minute, and whose leases' runs are held (see HoldRuns).
func pastDeadlineLocker(t *testing.T, obs fence.Observer, log *slog.Logger) fence.Locker {
	l := newLocker(t, shared.Endpoints(), &etcdlock.Options{WatchdogTTL: time.Minute, Observer: obs, Logger: log})
	etcdlock.HoldRuns(l)
	return l
}

// TestObservedLeaseEndsAtDeadlineBeforeItsTimer: as redislock's and
// redlock's. A lease whose deadline has passed is lost, whether or not its
// run has started and picked its expiry timer's case. Err used to return
// only what run had recorded: in that gap Err said the lease was held,
// Done was open, and Release deleted the key and returned nil (reported
// Released). Each of Err, Context, Done, Release and Extend, called first,
// must end the lease as run would (LostExpired, or LostRenewFailed for a
// watchdog lease, with run's error), reported once by the time it
// returns; the others then agree.
func TestObservedLeaseEndsAtDeadlineBeforeItsTimer(t *testing.T) {
	for _, watchdog := range []bool{false, true} {
		for _, first := range []string{"Err", "Context", "Done", "Release", "Extend"} {
			t.Run(fmt.Sprintf("watchdog=%v/%s", watchdog, first), func(t *testing.T) {
				observetest.PastDeadlineEnds(t, observetest.PastDeadlineCase{
					New: func(t *testing.T, obs fence.Observer) fence.Locker {
						return pastDeadlineLocker(t, obs, nil)
					},
					Pass:       etcdlock.PassDeadline,
					Watchdog:   watchdog,
					First:      first,
					Expired:    `": expired`,
					NotRenewed: `": not renewed before its deadline`,
				})
			})
		}
	}
}

// TestReentryAtEndPastDeadline: see observetest.ReentryAtEndPastDeadline.
// The end of a lease past its deadline is reported by whichever call finds
// it; a callback that calls the lease back must not deadlock on it
// (Release and Extend wait for ls.op, Release for run) nor see it held.
func TestReentryAtEndPastDeadline(t *testing.T) {
	observetest.ReentryAtEndPastDeadline(t, observetest.PastDeadline{
		New:      pastDeadlineLocker,
		Pass:     etcdlock.PassDeadline,
		Triggers: []string{"Err", "Context", "Done", "Release", "Extend"},
	})
}

// TestCallRacesExpiry: run's expiry timer and the first of Err or Release
// find the deadline passed at about the same moment (it is moved a few
// microseconds away): the lease ends once, and what is reported agrees
// with what Err and Release returned; see observetest.CallRacesExpiry.
func TestCallRacesExpiry(t *testing.T) {
	for _, first := range []string{"Err", "Release"} {
		t.Run(first, func(t *testing.T) {
			observetest.CallRacesExpiry(t, observetest.ExpiryRace{
				New: func(t *testing.T, obs fence.Observer) fence.Locker {
					return newLocker(t, shared.Endpoints(), &etcdlock.Options{Observer: obs})
				},
				Soon:    etcdlock.Soon,
				Expired: `": expired`,
			}, first)
		})
	}
}

// TestRenewalReadPastDeadline: as pglock's (tests/pglock). An Extend whose
// move of the key (its Txn) etcd applied in time, with its reply read after
// the lease's deadline passed (its run held): with nothing looking at the
// lease meanwhile, Extend returns nil with the new Deadline. If Err is
// called meanwhile, or Release (which waits for the Extend's ls.op), it
// ends the lease, reported once as an expiry: the late reply must not
// bring it back (Extend returns the loss, Err keeps it, the Deadline does
// not move, Release returns the loss), and the key, moved to the Extend's
// new etcd lease, is deleted (that etcd lease revoked).
func TestRenewalReadPastDeadline(t *testing.T) {
	h := &holdTxn{}
	c := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(h.intercept))
	admin := newClient(t, shared.Endpoints(), nil)
	late := observetest.LateRenewal{
		New: func(t *testing.T, obs fence.Observer) fence.Locker {
			l, err := etcdlock.New(c, &etcdlock.Options{Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			etcdlock.HoldRuns(l)
			return l
		},
		Hold: &h.ReplyHold,
		Pass: etcdlock.PassDeadline,
		// Nobody holds the key: it is deleted (its etcd lease revoked,
		// maybe in the background: wait for it, with a deadline).
		Ended: func(t *testing.T, ls fence.Lease) {
			key := ls.(*etcdlock.Lease).Key()
			for end := time.Now().Add(10 * time.Second); ; {
				resp, err := admin.Get(ctxFor(t, 10*time.Second), key)
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.Kvs) == 0 {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("the key %s of the ended lease is still there 10 s later", key)
				}
				time.Sleep(10 * time.Millisecond) // polling with a deadline
			}
		},
	}
	for _, then := range []string{"nothing", "Err", "Release"} {
		t.Run(then, func(t *testing.T) { observetest.RenewalReadPastDeadline(t, late, then) })
	}
}

// holdTxn is a unary interceptor that, when armed, lets a Txn run and
// holds its reply until open is closed, telling ran.
type holdTxn struct{ observetest.ReplyHold }

func (h *holdTxn) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil && method == "/etcdserverpb.KV/Txn" {
		h.Hold()
	}
	return err
}

// TestWatchdogRenewalReadPastDeadline: run's renewal of a watchdog lease
// (KeepAliveOnce) answered in time, its reply read after the deadline
// passed (run, busy renewing, cannot pick its expiry timer's case
// meanwhile): with nothing looking, the lease goes on, its Deadline moved;
// with Err called meanwhile, the lease ended then (not renewed, reported
// once), and the renewal's reply must not move its Deadline again nor
// report anything more; its etcd lease is revoked, the key deleted.
func TestWatchdogRenewalReadPastDeadline(t *testing.T) {
	h := &holdKeepAlive{}
	c := dialClient(t, shared.Endpoints(), grpc.WithChainStreamInterceptor(h.intercept))
	admin := newClient(t, shared.Endpoints(), nil)
	for _, looked := range []bool{false, true} {
		t.Run(fmt.Sprintf("looked=%v", looked), func(t *testing.T) {
			h.ran, h.open = make(chan struct{}, 1), make(chan struct{})
			ctx := ctxFor(t, 30*time.Second)
			rec := &observetest.Recorder{}
			// Renewed every second: the first renewal comes a second in.
			l, err := etcdlock.New(c, &etcdlock.Options{Observer: rec, WatchdogTTL: 3 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			h.armed.Store(true)
			defer h.armed.Store(false)
			ls, err := l.Acquire(ctx, fmt.Sprintf("deadline-gap:watchdog-late-read:%v", looked))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = ls.Release(ctx) }()
			select {
			case <-h.ran:
			case <-time.After(10 * time.Second):
				t.Fatal("the watchdog's renewal did not run")
			}
			past := time.Now().Add(-time.Millisecond)
			etcdlock.SetDeadline(ls, past) // passed while the reply is out
			var seen error
			if looked {
				if seen = ls.Err(); !errors.Is(seen, fence.ErrLeaseLost) {
					t.Errorf("Err past the deadline, the renewal's reply out = %v, want ErrLeaseLost", seen)
				}
			}
			close(h.open)
			if !looked {
				// The renewal moves the Deadline on: wait for it, with a
				// deadline.
				for end := time.Now().Add(10 * time.Second); !time.Now().Before(ls.Deadline()); {
					if time.Now().After(end) {
						t.Fatal("the renewal read late did not move the Deadline in 10 s")
					}
					time.Sleep(time.Millisecond) // polling with a deadline
				}
				if e := ls.Err(); e != nil {
					t.Errorf("Err after the renewal read late = %v, want nil", e)
				}
				if ends := rec.Ends(); len(ends) != 0 {
					t.Errorf("ends reported %+v, want none", ends)
				}
				if err := ls.Release(ctx); err != nil {
					t.Errorf("Release = %v", err)
				}
				return
			}
			// The lease's key is deleted (its etcd lease revoked, in the
			// background): by then the renewal's reply has been read.
			key := ls.(*etcdlock.Lease).Key()
			for end := time.Now().Add(10 * time.Second); ; {
				resp, err := admin.Get(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.Kvs) == 0 {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("the key %s of the ended lease is still there 10 s later", key)
				}
				time.Sleep(10 * time.Millisecond) // polling with a deadline
			}
			if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) || err.Error() != seen.Error() {
				t.Errorf("Release = %v, want %v", err, seen) // Release joins run: its renewal has returned
			}
			if d := ls.Deadline(); !d.Equal(past) {
				t.Errorf("the renewal read after the lease ended moved its Deadline to %v from now", time.Until(d))
			}
			if e := ls.Err(); e != seen {
				t.Errorf("Err after the late reply = %v, want %v still", e, seen)
			}
			if ends := rec.Ends(); len(ends) != 1 || ends[0].Cause != fence.LostRenewFailed {
				t.Errorf("ends reported %+v, want one, renew_failed", ends)
			}
		})
	}
}

// holdKeepAlive is a stream interceptor that, when armed, holds the first
// reply read on a LeaseKeepAlive stream until open is closed, telling ran.
type holdKeepAlive struct {
	armed     atomic.Bool
	ran, open chan struct{}
}

func (h *holdKeepAlive) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Lease/LeaseKeepAlive" || !h.armed.Load() {
		return cs, err
	}
	return &heldStream{ClientStream: cs, h: h}, nil
}

type heldStream struct {
	grpc.ClientStream
	h *holdKeepAlive
}

func (s *heldStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		select {
		case s.h.ran <- struct{}{}:
			<-s.h.open
		default: // held once
		}
	}
	return err
}

// TestReleaseAsDeadlineMovesReportsOnce: see
// observetest.ReleaseAsDeadlineMoves. Release's checks of the deadline race
// a goroutine that moves it as renewals do (runs held).
func TestReleaseAsDeadlineMovesReportsOnce(t *testing.T) {
	observetest.ReleaseAsDeadlineMoves(t, observetest.DeadlineFlip{
		New: func(t *testing.T, obs fence.Observer) fence.Locker {
			return pastDeadlineLocker(t, obs, nil)
		},
		Set: etcdlock.SetDeadline,
	})
}

// TestExtendSettlingPastDeadline: an Extend whose move Txn got no answer
// settles it (settleTxn), holding ls.op, and waits between its attempts
// for the lease's end. Its deadline passes meanwhile (its run held): that
// wait must not end the lease and report it there, as Done does for the
// holder, or the callback told (which calls Release, waiting for ls.op)
// would wait for the very Extend that called it. The Extend ends the lease
// as expired once the move is settled, and its end is reported once ls.op
// is free: the callback's calls return the loss.
func TestExtendSettlingPastDeadline(t *testing.T) {
	h := &failTxns{}
	c := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(h.intercept))
	ctx := ctxFor(t, 30*time.Second)
	r := observetest.NewReentry()
	l, err := etcdlock.New(c, &etcdlock.Options{Observer: r})
	if err != nil {
		t.Fatal(err)
	}
	etcdlock.HoldRuns(l)
	ls, err := l.Acquire(ctx, "deadline-gap:extend-settling", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	r.Set(ls)
	// The move fails, and the settling's first attempt too, which passes
	// the deadline as it fails: the settling then waits for its next
	// attempt.
	h.fail.Store(2)
	h.then = func() { etcdlock.SetDeadline(ls, time.Now().Add(-time.Millisecond)) }
	ext := make(chan error, 1)
	go func() { ext <- ls.Extend(ctx, time.Minute) }()
	select {
	case err := <-ext:
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Errorf("Extend = %v, want ErrLeaseLost", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("Extend did not return in 20 s:\n%s", observetest.Stacks())
	}
	res := r.Calls(t, 20*time.Second)
	for what, e := range map[string]error{"Extend": res.Extend, "Release": res.Release, "second Release": res.Again, "Err": res.Err, "Context's cause": res.ContextCause} {
		if !errors.Is(e, fence.ErrLeaseLost) {
			t.Errorf("%s from the callback = %v, want ErrLeaseLost", what, e)
		}
	}
	if ends := r.Ends(); len(ends) != 1 || ends[0].Cause != fence.LostExpired {
		t.Errorf("reported ends %+v, want one, expired", ends)
	}
}

// failTxns is a unary interceptor that fails the next fail Txns, without
// sending them, and calls then (if set) as it fails the last.
type failTxns struct {
	fail atomic.Int32
	then func()
}

func (h *failTxns) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == "/etcdserverpb.KV/Txn" {
		if n := h.fail.Add(-1); n >= 0 {
			if n == 0 && h.then != nil {
				h.then()
			}
			return errors.New("failTxns: no answer")
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}
