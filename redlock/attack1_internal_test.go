package redlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// attack1Calls is what a LeaseEnded callback's calls into the lease
// returned.
type attack1Calls struct {
	cause          fence.LeaseCause
	extend         error
	release, again error
	err, ctxCause  error
	doneClosed     bool
}

// attack1Reenter is an Observer (and, through attack1Handler, a Logger's
// handler) that records every end and, on the first, calls every method of
// the lease back: Extend, Release twice, Err, Context, Done.
type attack1Reenter struct {
	fence.NopObserver
	mu    sync.Mutex
	ends  []fence.LeaseEvent
	lease fence.Lease
	done  chan attack1Calls
}

func newAttack1Reenter() *attack1Reenter { return &attack1Reenter{done: make(chan attack1Calls, 1)} }

func (r *attack1Reenter) LeaseEnded(e fence.LeaseEvent) {
	r.mu.Lock()
	r.ends = append(r.ends, e)
	r.mu.Unlock()
	r.call(e.Cause)
}

func (r *attack1Reenter) call(cause fence.LeaseCause) {
	r.mu.Lock()
	ls := r.lease
	r.lease = nil
	r.mu.Unlock()
	if ls == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res := attack1Calls{cause: cause}
	res.extend = ls.Extend(ctx, time.Minute)
	res.release = ls.Release(ctx)
	res.again = ls.Release(ctx)
	res.err = ls.Err()
	res.ctxCause = context.Cause(ls.Context())
	select {
	case <-ls.Done():
		res.doneClosed = true
	default:
	}
	r.done <- res
}

func (r *attack1Reenter) endsSoFar() []fence.LeaseEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]fence.LeaseEvent(nil), r.ends...)
}

type attack1Handler struct{ r *attack1Reenter }

func (h attack1Handler) Enabled(context.Context, slog.Level) bool { return true }
func (h attack1Handler) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, "lease lost") {
		h.r.call("")
	}
	return nil
}
func (h attack1Handler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h attack1Handler) WithGroup(string) slog.Handler      { return h }

func attack1Stacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

func attack1Nodes(t *testing.T) []redis.UniversalClient {
	var clients []redis.UniversalClient
	for range 3 {
		clients = append(clients, redistest.Start(t).Client(t))
	}
	return clients
}

// TestAttack1ReentryAtDueEnd: as redislock's. The end of a lease past its
// deadline, before its expiry timer ran, is now reported synchronously by
// Err, Context, Done or Release (dueLocked, b49970e), and by Close (which
// calls Err on each listed lease). A LeaseEnded callback (or a Logger's
// handler told "lease lost") that calls the lease's Extend, Release
// (twice), Err, Context and Done must not deadlock, for fixed-TTL and
// watchdog leases; every answer is the expiry, reported once.
// Guards a risk; passes on HEAD.
func TestAttack1ReentryAtDueEnd(t *testing.T) {
	clients := attack1Nodes(t)
	for _, logged := range []bool{false, true} {
		for _, watchdog := range []bool{false, true} {
			for _, trigger := range []string{"Err", "Context", "Done", "Release", "Close"} {
				name := fmt.Sprintf("logged=%v/watchdog=%v/%s", logged, watchdog, trigger)
				t.Run(name, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					r := newAttack1Reenter()
					opts := &Options{WatchdogTTL: time.Minute}
					if logged {
						opts.Logger = slog.New(attack1Handler{r})
					} else {
						opts.Observer = r
					}
					l, err := New(clients, opts)
					if err != nil {
						t.Fatal(err)
					}
					defer func() { _ = l.Close(ctx) }()
					var acq []fence.Option
					if !watchdog {
						acq = append(acq, fence.TTL(time.Minute))
					}
					fl, err := l.Acquire(ctx, "attack1:reentry:"+strings.ReplaceAll(name, "/", ":"), acq...)
					if err != nil {
						t.Fatal(err)
					}
					ls := fl.(*lease)
					r.mu.Lock()
					r.lease = ls
					r.mu.Unlock()
					ls.mu.Lock()
					if ls.expiry == nil {
						ls.mu.Unlock()
						t.Fatal("no expiry timer")
					}
					ls.deadline = time.Now().Add(-time.Millisecond) // the timer still waits for the old one
					ls.mu.Unlock()

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
						case "Close":
							if err := l.Close(ctx); err != nil {
								trig <- err
								return
							}
							trig <- ls.Err()
						}
					}()
					var got error
					select {
					case got = <-trig:
					case <-time.After(20 * time.Second):
						t.Fatalf("%s on a lease past its deadline did not return in 20 s (deadlock?):\n%s", trigger, attack1Stacks())
					}
					if !errors.Is(got, fence.ErrLeaseLost) {
						t.Errorf("%s = %v, want ErrLeaseLost", trigger, got)
					}
					var res attack1Calls
					select {
					case res = <-r.done:
					case <-time.After(20 * time.Second):
						t.Fatalf("the callback's calls did not return in 20 s (deadlock?):\n%s", attack1Stacks())
					}
					for what, e := range map[string]error{"Extend": res.extend, "Release": res.release, "second Release": res.again, "Err": res.err, "Context's cause": res.ctxCause} {
						if !errors.Is(e, fence.ErrLeaseLost) {
							t.Errorf("%s from the callback = %v, want ErrLeaseLost", what, e)
						}
					}
					if !res.doneClosed {
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
						if ends := r.endsSoFar(); len(ends) != 1 || ends[0].Cause != want {
							t.Errorf("reported ends %+v, want one, %s", ends, want)
						}
					}
				})
			}
		}
	}
}

// TestAttack1ExtendInGapReportsExpiry: b49970e makes Err, Context and
// Release end a lease past its deadline before its timer ran, but Extend
// still checks it with expiredLocked, which ends only a lease without a
// timer. An observed lease in that gap so has its Extend sent to every
// node, refused there as late, and ends as LostRenewLate ("removed or
// taken by another owner on 0 of 3 nodes, and 3 renewals reached their
// node after the lease's deadline"), where the same lease unobserved
// answers the expiry at once, sending nothing, and redislock's Extend
// (which calls Err) reports LostExpired.
// FAILS on HEAD (cause renew_late; error says another owner).
func TestAttack1ExtendInGapReportsExpiry(t *testing.T) {
	clients := attack1Nodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := newAttack1Reenter()
	l, err := New(clients, &Options{Observer: r})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close(ctx) }()
	fl, err := l.Acquire(ctx, "attack1:extend-gap", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ls := fl.(*lease)
	ls.mu.Lock()
	ls.deadline = time.Now().Add(-time.Millisecond)
	ls.mu.Unlock()
	err = ls.Extend(ctx, time.Minute)
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend after the deadline = %v, want ErrLeaseLost", err)
	}
	if strings.Contains(err.Error(), "another owner") {
		t.Errorf("Extend after the deadline = %v: want the expiry, not a loss to another owner", err)
	}
	if ends := r.endsSoFar(); len(ends) != 1 || ends[0].Cause != fence.LostExpired {
		t.Errorf("reported ends %+v, want one, LostExpired", ends)
	}
}

// TestAttack1ReleaseDueRaceMissingReport: redislock's race (a renewal
// moving the deadline between the due check and the end) ported: redlock's
// Release checks and ends under one hold of ls.mu (dueLocked), so every
// Release's end must be reported once by the time it returns.
// Guards a risk; passes on HEAD.
func TestAttack1ReleaseDueRaceMissingReport(t *testing.T) {
	clients := attack1Nodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var ends atomic.Int64
	l, err := New(clients, &Options{Observer: &attack1Counter{n: &ends}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close(ctx) }()
	stopAt := time.Now().Add(10 * time.Second)
	var missing, expired, released int
	for i := 0; time.Now().Before(stopAt) && missing == 0; i++ {
		fl, err := l.Acquire(ctx, fmt.Sprintf("attack1:race:%d", i), fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		ls := fl.(*lease)
		before := ends.Load()
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
		n := ends.Load() - before
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

type attack1Counter struct {
	fence.NopObserver
	n *atomic.Int64
}

func (c *attack1Counter) LeaseEnded(fence.LeaseEvent) { c.n.Add(1) }
