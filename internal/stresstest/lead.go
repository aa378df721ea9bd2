package stresstest

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// LeadCancels runs rounds of two fence.Lead candidates, on Lockers a and b
// (two clients of one backend), for one lock, each with a ctx cancelled at
// a random moment within 60 ms: during a campaign, a term, a release or a
// back-off. Their fn returns early now and then (the term ends, Lead
// releases and campaigns again). Each round checks that both Leads return
// context.Canceled within returnWithin of their cancel; that no term began
// before the one before it had returned; that tokens grew from term to
// term; and, once both returned, that the lock is free: an Acquire on a
// with budget probe takes it. A try that a cancelled campaign left behind
// on the server (a lock granted to nobody, a waiter's entry ahead in line)
// would hold it until it expired: make probe shorter than the lease times
// of a and b.
func LeadCancels(t *testing.T, rounds int, a, b fence.Locker, returnWithin, probe time.Duration) {
	t.Helper()
	type term struct {
		who        int
		token      fence.Token
		start, end time.Time
	}
	var mu sync.Mutex
	var terms []*term
	name := "lead-cancels"
	for round := range rounds {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		late := make([]time.Duration, 2)
		for i, l := range []fence.Locker{a, b} {
			ctx, cancel := context.WithCancel(context.Background())
			var cancelled time.Time
			stop := time.AfterFunc(time.Duration(rand.IntN(60))*time.Millisecond, func() {
				mu.Lock()
				cancelled = time.Now()
				mu.Unlock()
				cancel()
			})
			wg.Go(func() {
				defer cancel()
				errs[i] = fence.Lead(ctx, l, name, func(ctx context.Context, lease fence.Lease) error {
					tm := &term{who: i, token: lease.Token(), start: time.Now()}
					mu.Lock()
					terms = append(terms, tm)
					mu.Unlock()
					if rand.IntN(3) != 0 {
						<-ctx.Done()
					}
					mu.Lock()
					tm.end = time.Now()
					mu.Unlock()
					return nil
				}, fence.Backoff(time.Millisecond, 10*time.Millisecond))
				stop.Stop()
				mu.Lock()
				if !cancelled.IsZero() {
					late[i] = time.Since(cancelled)
				}
				mu.Unlock()
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(returnWithin + 100*time.Millisecond):
			t.Fatalf("round %d: a Lead had not returned %v after its ctx was cancelled", round, returnWithin)
		}
		for i, err := range errs {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("round %d: candidate %d: Lead = %v, want context.Canceled", round, i, err)
			}
			if late[i] > returnWithin {
				t.Errorf("round %d: candidate %d: Lead returned %v after its ctx was cancelled, want within %v", round, i, late[i], returnWithin)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), probe+5*time.Second)
		start := time.Now()
		lease, err := a.Acquire(ctx, name, fence.Wait(probe))
		if err != nil {
			cancel()
			t.Fatalf("round %d: after both Leads returned, the lock was not free within %v: %v", round, time.Since(start), err)
		}
		err = lease.Release(ctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(terms); i++ {
		p, n := terms[i-1], terms[i]
		if n.token <= p.token {
			t.Errorf("term %d (candidate %d) token %d after token %d", i, n.who, n.token, p.token)
		}
		if n.start.Before(p.end) {
			t.Errorf("term %d (candidate %d, token %d) began %v before term %d (token %d) returned", i, n.who, n.token, p.end.Sub(n.start), i-1, p.token)
		}
	}
	t.Logf("%d rounds, %d terms", rounds, len(terms))
}
