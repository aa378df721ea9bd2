package stresstest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// Term is one term of a Lead candidate: from fn's start to the end of its
// lease (or fn's return, if sooner).
type Term struct {
	Who        string
	Token      fence.Token
	Start, End time.Time
	Cause      error
}

// TermLog records every Lead candidate's terms, in the order they began.
type TermLog struct {
	mu  sync.Mutex
	all []*Term
}

// Fn is fence.Lead's fn for candidate who: it records the term and
// waits for its context to end.
func (r *TermLog) Fn(who string) func(ctx context.Context, lease fence.Lease) error {
	return func(ctx context.Context, lease fence.Lease) error {
		tm := &Term{Who: who, Token: lease.Token(), Start: time.Now()}
		r.mu.Lock()
		r.all = append(r.all, tm)
		r.mu.Unlock()
		stop := context.AfterFunc(lease.Context(), func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if tm.End.IsZero() {
				tm.End = time.Now()
			}
		})
		defer stop()
		<-ctx.Done()
		r.mu.Lock()
		defer r.mu.Unlock()
		tm.Cause = context.Cause(ctx)
		if tm.End.IsZero() {
			tm.End = time.Now()
		}
		return nil
	}
}

// Terms returns a copy of the terms so far.
func (r *TermLog) Terms() []Term {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Term, len(r.all))
	for i, tm := range r.all {
		out[i] = *tm
	}
	return out
}

// WaitTerms polls (with a deadline) until cond holds for the terms.
func (r *TermLog) WaitTerms(within time.Duration, cond func([]Term) bool) ([]Term, bool) {
	for deadline := time.Now().Add(within); ; time.Sleep(5 * time.Millisecond) { // polling with a deadline
		all := r.Terms()
		if cond(all) {
			return all, true
		}
		if time.Now().After(deadline) {
			return all, false
		}
	}
}

// Check fails t if a term began before the one before it ended, or if
// tokens did not grow from term to term.
func (r *TermLog) Check(t *testing.T) {
	t.Helper()
	all := r.Terms()
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if b.Token <= a.Token {
			t.Errorf("term %d (%s) token %d after token %d", i, b.Who, b.Token, a.Token)
		}
		if a.End.IsZero() || b.Start.Before(a.End) {
			t.Errorf("terms overlap: %s token %d ended at %v, %s token %d started at %v",
				a.Who, a.Token, a.End.Format(time.StampMicro), b.Who, b.Token, b.Start.Format(time.StampMicro))
		}
	}
}
