package zklock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// leadTerm is one term of a candidate: from fn's start to the end of its
// lease (or fn's return, if sooner).
type leadTerm struct {
	who        string
	token      fence.Token
	start, end time.Time
	cause      error
}

// leadLog records every candidate's terms, in the order they began.
type leadLog struct {
	mu  sync.Mutex
	all []*leadTerm
}

func (r *leadLog) fn(who string) func(ctx context.Context, lease fence.Lease) error {
	return func(ctx context.Context, lease fence.Lease) error {
		tm := &leadTerm{who: who, token: lease.Token(), start: time.Now()}
		r.mu.Lock()
		r.all = append(r.all, tm)
		r.mu.Unlock()
		stop := context.AfterFunc(lease.Context(), func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if tm.end.IsZero() {
				tm.end = time.Now()
			}
		})
		defer stop()
		<-ctx.Done()
		r.mu.Lock()
		defer r.mu.Unlock()
		tm.cause = context.Cause(ctx)
		if tm.end.IsZero() {
			tm.end = time.Now()
		}
		return nil
	}
}

func (r *leadLog) terms() []leadTerm {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]leadTerm, len(r.all))
	for i, tm := range r.all {
		out[i] = *tm
	}
	return out
}

// waitTerms polls (with a deadline) until cond holds for the terms.
func (r *leadLog) waitTerms(within time.Duration, cond func([]leadTerm) bool) ([]leadTerm, bool) {
	for deadline := time.Now().Add(within); ; time.Sleep(5 * time.Millisecond) { // polling with a deadline
		all := r.terms()
		if cond(all) {
			return all, true
		}
		if time.Now().After(deadline) {
			return all, false
		}
	}
}

// check fails t if a term began before the one before it ended, or if
// tokens did not grow from term to term.
func (r *leadLog) check(t *testing.T) {
	t.Helper()
	all := r.terms()
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if b.token <= a.token {
			t.Errorf("term %d (%s) token %d after token %d", i, b.who, b.token, a.token)
		}
		if a.end.IsZero() || b.start.Before(a.end) {
			t.Errorf("terms overlap: %s token %d ended at %v, %s token %d started at %v",
				a.who, a.token, a.end.Format(time.StampMicro), b.who, b.token, b.start.Format(time.StampMicro))
		}
	}
}

// Three candidates, each on a session of its own, campaign on a standalone
// ZooKeeper; the server is paused (SIGSTOP) under the leader, past the
// session timeout, three times. The leader's fn must see its context end
// while the server is still stopped (nobody can be elected then), with a
// cause matching ErrLeaseLost; after SIGCONT a leader is elected again,
// with a greater token, after every earlier term ended.
func TestLeadServerPausedPastTTL(t *testing.T) {
	srv := startZK(t)
	var r leadLog
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, who := range []string{"a", "b", "c"} {
		l, _ := newLocker(t, []string{srv.Addr})
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "paused", r.fn(who), fence.Backoff(20*time.Millisecond, 200*time.Millisecond),
				fence.LeaseOptions(fence.Wait(5*time.Second)))
		})
	}
	if _, ok := r.waitTerms(10*time.Second, func(all []leadTerm) bool { return len(all) > 0 }); !ok {
		t.Fatal("no leader within 10 s")
	}
	for round := 1; round <= 3; round++ {
		before := r.terms()
		cur := before[len(before)-1]
		srv.Stop()
		paused := time.Now()
		all, ok := r.waitTerms(sessionTimeout+5*time.Second, func(all []leadTerm) bool { return !all[len(before)-1].end.IsZero() })
		srv.Cont()
		if !ok {
			t.Fatalf("round %d: %s (token %d) still leads %v after the server was paused (session timeout %v)", round, cur.who, cur.token, time.Since(paused), sessionTimeout)
		}
		if len(all) != len(before) {
			t.Fatalf("round %d: %d terms began while the server was paused", round, len(all)-len(before))
		}
		all, ok = r.waitTerms(20*time.Second, func(all []leadTerm) bool { return len(all) > len(before) })
		if !ok {
			t.Fatalf("round %d: no leader within 20 s of SIGCONT", round)
		}
		ended := all[len(before)-1]
		t.Logf("round %d: %s's term ended %v after the pause (%v); %s leads %v after the pause", round, ended.who, ended.end.Sub(paused), ended.cause, all[len(before)].who, all[len(before)].start.Sub(paused))
		if ended.end.After(paused) && !errors.Is(ended.cause, fence.ErrLeaseLost) {
			t.Errorf("round %d: the paused leader's fn saw %v, want ErrLeaseLost", round, ended.cause)
		}
	}
	cancel()
	wg.Wait()
	r.check(t)
}

// Three candidates on sessions of their own; the leader's host is cut off
// from ZooKeeper (its connections closed, new ones refused) while the
// others still reach it. Its fn must see its context end, with
// ErrLeaseLost, before another candidate's term begins (ZooKeeper hands the
// lock on only when the cut-off session expires); when the partition heals
// the old leader campaigns again without disturbing the new one.
func TestLeadLeaderPartitioned(t *testing.T) {
	srv := startZK(t)
	var r leadLog
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	parts := map[string]*partition{}
	for _, who := range []string{"a", "b", "c"} {
		p := &partition{}
		parts[who] = p
		l := newLockerDialer(t, []string{srv.Addr}, p.dial)
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "partitioned", r.fn(who), fence.Backoff(20*time.Millisecond, 200*time.Millisecond),
				fence.LeaseOptions(fence.Wait(5*time.Second)))
		})
	}
	all, ok := r.waitTerms(10*time.Second, func(all []leadTerm) bool { return len(all) > 0 })
	if !ok {
		t.Fatal("no leader within 10 s")
	}
	first := all[0]
	parts[first.who].set(true)
	cut := time.Now()
	all, ok = r.waitTerms(3*sessionTimeout+5*time.Second, func(all []leadTerm) bool { return len(all) > 1 })
	if !ok {
		t.Fatalf("no new leader %v after %s was cut off", time.Since(cut), first.who)
	}
	t.Logf("%s's term ended %v after the cut (%v); %s leads %v after it", first.who, all[0].end.Sub(cut), all[0].cause, all[1].who, all[1].start.Sub(cut))
	if !errors.Is(all[0].cause, fence.ErrLeaseLost) {
		t.Errorf("the cut-off leader's fn saw %v, want ErrLeaseLost", all[0].cause)
	}
	parts[first.who].set(false)
	second := all[1]
	// The healed candidate reconnects (its session expired: go-zookeeper
	// makes a new one) and waits in line; the new leader goes on.
	if all, _ := r.waitTerms(2*sessionTimeout, func(all []leadTerm) bool { return len(all) > 2 || !all[1].end.IsZero() }); len(all) > 2 || !all[1].end.IsZero() {
		t.Errorf("after the partition healed, %s's term ended (%v) or a new one began (%d terms)", second.who, all[1].cause, len(all))
	}
	cancel()
	wg.Wait()
	r.check(t)
}
