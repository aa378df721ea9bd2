package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// term is one run of a candidate's fn: from its start to the end of its
// validity, the earlier of the lease's end and fn's return.
type term struct {
	who        string
	token      fence.Token
	start, end time.Time
	cause      error       // context.Cause of fn's context when fn saw it end
	lease      fence.Lease // the term's
}

// terms records the terms of every candidate.
type terms struct {
	mu  sync.Mutex
	all []*term
	log []string // events in the order they happened
}

func (r *terms) event(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, fmt.Sprintf(format, args...))
}

// fn returns a leader function for candidate who that works until its
// context ends, or until early says to return.
func (r *terms) fn(who string, early func() error) func(ctx context.Context, lease fence.Lease) error {
	return func(ctx context.Context, lease fence.Lease) error {
		tm := &term{who: who, token: lease.Token(), start: time.Now(), lease: lease}
		r.mu.Lock()
		r.all = append(r.all, tm)
		r.log = append(r.log, who+" start")
		r.mu.Unlock()
		stop := context.AfterFunc(lease.Context(), func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if tm.end.IsZero() {
				tm.end = time.Now()
			}
		})
		defer stop()
		var err error
		if early != nil {
			err = early()
		}
		if err == nil {
			<-ctx.Done()
			tm.cause = context.Cause(ctx)
			r.event("%s cancelled", who)
		}
		r.mu.Lock()
		if tm.end.IsZero() {
			tm.end = time.Now()
		}
		r.log = append(r.log, who+" return")
		r.mu.Unlock()
		return err
	}
}

// check fails t if two terms overlapped or tokens did not increase with
// time; it returns the terms in order. A term that ended is valid until
// the earlier of its end as seen (by fn or the AfterFunc on its lease's
// context) and its lease's Deadline: after the Deadline the lease is no
// longer known to be held, and the end of a lease that expired is seen
// when the scheduler runs its timer, which a loaded machine delays past
// the next term's start (a CI run: 37 ms). A term seen to end more than
// a second past its Deadline fails it too: a lease must end by it.
func (r *terms) check(t *testing.T) []*term {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 1; i < len(r.all); i++ {
		a, b := r.all[i-1], r.all[i]
		if b.token <= a.token {
			t.Errorf("term %d (%s) token %d after token %d", i, b.who, b.token, a.token)
		}
		if a.end.IsZero() {
			continue
		}
		valid := a.end
		if dl := a.lease.Deadline(); dl.Before(valid) {
			valid = dl
		}
		if late := a.end.Sub(a.lease.Deadline()); late > time.Second {
			t.Errorf("%s token %d ended %v after its deadline %v", a.who, a.token, late, a.lease.Deadline().Format(time.StampMicro))
		}
		if b.start.Before(valid) {
			t.Errorf("terms overlap: %s token %d valid until %v (ended %v, deadline %v), %s token %d started at %v",
				a.who, a.token, valid.Format(time.StampMicro), a.end.Format(time.StampMicro), a.lease.Deadline().Format(time.StampMicro),
				b.who, b.token, b.start.Format(time.StampMicro))
		}
	}
	return append([]*term(nil), r.all...)
}

func newMemlock(t testing.TB) *memlock.Locker {
	l, err := memlock.New(&memlock.Options{WatchdogTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A removed lock goes to the other candidate at once; the deposed fn sees
// its context cancelled with ErrLeaseLost; over many removals no two terms
// overlap and the tokens increase.
func TestLeadRemovedLockMoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		ctx, cancel := context.WithCancel(t.Context())
		var r terms
		var wg sync.WaitGroup
		for _, who := range []string{"a", "b", "c"} {
			wg.Go(func() { _ = fence.Lead(ctx, l, "leader", r.fn(who, nil)) })
		}
		const removals = 20
		var removedAt []time.Time
		for range removals {
			time.Sleep(time.Duration(200+rand.IntN(800)) * time.Millisecond)
			synctest.Wait()
			removedAt = append(removedAt, time.Now())
			if !l.Remove("leader") {
				t.Fatal("nobody led")
			}
		}
		time.Sleep(time.Second)
		cancel()
		wg.Wait()
		all := r.check(t)
		if len(all) != removals+1 {
			t.Fatalf("%d terms for %d removals", len(all), removals)
		}
		for i, at := range removedAt {
			if !errors.Is(all[i].cause, fence.ErrLeaseLost) {
				t.Errorf("term %d: fn's context cause %v, want ErrLeaseLost", i, all[i].cause)
			}
			if lag := all[i+1].start.Sub(at); lag > 0 {
				t.Errorf("term %d started %v after the removal; the waiting candidate should take it at once", i+1, lag)
			}
		}
	})
}

// A leader whose fixed lease runs out (a paused leader that stops
// extending) is replaced within the lease time; a leader that steps down
// (its ctx ends) has seen its context cancelled and returned before the next
// leader starts.
func TestLeadExpiryAndHandover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		var r terms
		actx, acancel := context.WithCancelCause(t.Context())
		bctx, bcancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		const ttl = 2 * time.Second
		aErr := make(chan error, 1)
		wg.Go(func() { aErr <- fence.Lead(actx, l, "leader", r.fn("a", nil), fence.LeaseOptions(fence.TTL(ttl))) })
		synctest.Wait()
		began := time.Now()
		wg.Go(func() { _ = fence.Lead(bctx, l, "leader", r.fn("b", nil), fence.LeaseOptions(fence.TTL(ttl))) })
		time.Sleep(ttl + time.Millisecond)
		synctest.Wait()
		all := r.check(t)
		if len(all) != 2 || all[1].who != "b" {
			t.Fatalf("terms after a's lease ran out: %+v", all)
		}
		if lag := all[1].start.Sub(began); lag > ttl {
			t.Fatalf("b led %v after a's lease began, want within the lease time %v", lag, ttl)
		}
		if !errors.Is(all[0].cause, fence.ErrLeaseLost) {
			t.Fatalf("a's fn saw cause %v, want ErrLeaseLost", all[0].cause)
		}
		// a campaigns again after its back-off and waits; b steps down.
		time.Sleep(time.Second)
		r.mu.Lock()
		n := len(r.log)
		r.mu.Unlock()
		bcancel()
		synctest.Wait()
		r.mu.Lock()
		log := fmt.Sprint(r.log[n:])
		r.mu.Unlock()
		if want := "[b cancelled b return a start]"; log != want {
			t.Fatalf("events after b stepped down %s, want %s", log, want)
		}
		why := errors.New("shutting down")
		acancel(why)
		if err := <-aErr; err != why {
			t.Fatalf("Lead returned %v, want ctx's cause", err)
		}
		wg.Wait()
		if lease, err := l.Acquire(t.Context(), "leader"); err != nil {
			t.Fatalf("the lock was not released when Lead returned: %v", err)
		} else {
			_ = lease.Release(t.Context())
		}
	})
}

// A fn that returns early gives the lock up, is reported to OnDeposed, and
// campaigns again after a back-off that doubles, jittered, and is capped.
func TestLeadEarlyReturnBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		ctx, cancel := context.WithCancel(t.Context())
		boom := errors.New("boom")
		var elected []time.Time
		var deposedErrs []error
		done := make(chan error)
		go func() {
			done <- fence.Lead(ctx, l, "leader",
				func(ctx context.Context, lease fence.Lease) error { return boom },
				fence.Backoff(100*time.Millisecond, time.Second),
				fence.OnElected(func(fence.Lease) { elected = append(elected, time.Now()) }),
				fence.OnDeposed(func(_ fence.Lease, err error) { deposedErrs = append(deposedErrs, err) }))
		}()
		time.Sleep(10 * time.Second)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Lead = %v, want context.Canceled", err)
		}
		if len(elected) < 8 {
			t.Fatalf("elected %d times in 10s", len(elected))
		}
		for i, err := range deposedErrs {
			if !errors.Is(err, boom) {
				t.Fatalf("OnDeposed #%d err = %v, want fn's error", i, err)
			}
		}
		for i := 1; i < len(elected); i++ {
			gap := elected[i].Sub(elected[i-1])
			hi := min(100*time.Millisecond<<i, time.Second)
			if gap < hi/2 || gap > hi {
				t.Errorf("pause %d = %v, want in [%v, %v]", i, gap, hi/2, hi)
			}
		}
	})
}

func TestLeadInvalidInput(t *testing.T) {
	l := newMemlock(t)
	fn := func(context.Context, fence.Lease) error { t.Error("fn ran"); return nil }
	for _, c := range []struct {
		name string
		opts []fence.LeadOption
		want error
	}{
		{"", nil, fence.ErrInvalidName},
		{"x", []fence.LeadOption{fence.LeaseOptions(fence.TTL(time.Millisecond))}, fence.ErrInvalidOption},
		{"x", []fence.LeadOption{fence.Backoff(0, time.Second)}, fence.ErrInvalidOption},
		{"x", []fence.LeadOption{fence.Backoff(time.Second, time.Millisecond)}, fence.ErrInvalidOption},
	} {
		if err := fence.Lead(t.Context(), l, c.name, fn, c.opts...); !errors.Is(err, c.want) {
			t.Errorf("Lead(%q) = %v, want %v", c.name, err, c.want)
		}
	}
}

// closedLease is a lease whose Release fails as on a client the user
// closed, counting its calls.
type closedLease struct {
	fence.Lease
	releases *int
}

func (l closedLease) Release(ctx context.Context) error {
	*l.releases++
	_ = l.Lease.Release(ctx)
	return fmt.Errorf("the client was closed: %w", fence.ErrClosed)
}

type closedLocker struct {
	fence.Locker
	releases *int
}

func (l closedLocker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	return closedLease{lease, l.releases}, nil
}

// Run retries a Release that failed without a conclusion, but not one that
// says the client was closed (fence.ErrClosed): no retry can succeed, and
// Run (and Lead, which waits for it) would go on for its 5 s.
func TestRunNoRetryOnClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := memlock.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		var releases int
		start := time.Now()
		err = fence.Run(t.Context(), closedLocker{m, &releases}, "closed", func(context.Context, fence.Lease) error { return nil })
		if !errors.Is(err, fence.ErrClosed) || releases != 1 {
			t.Errorf("Run = %v after %d Releases in %v; want ErrClosed after one", err, releases, time.Since(start))
		}
	})
}
