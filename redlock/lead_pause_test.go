package redlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
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

// Three candidates, each with clients of its own, campaign on three Redis
// masters. One master paused (SIGSTOP) for three lease times changes
// nothing: the leader renews on the other two and goes on leading. Two
// paused (a majority) under the leader: its fn must see its context end,
// with ErrLeaseLost, while they are still stopped (no majority can elect
// anyone then); once they resume a leader is elected again, with a greater
// token, after every earlier term ended.
func TestLeadMajorityPaused(t *testing.T) {
	const ttl = 600 * time.Millisecond
	srvs := nodes(t, 3)
	var r leadLog
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, who := range []string{"a", "b", "c"} {
		l, err := redlock.New(clients(t, srvs), &redlock.Options{WatchdogTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
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
		// One node paused: a minority. The lease may hold only two nodes
		// (the third still had the last term's key, until it expired,
		// when it was acquired): pause one the lease can do without.
		pick := round % 3
		var holds []string
		for _, c := range clients(t, srvs) {
			v, _ := c.Get(t.Context(), "redlock:{paused}").Result()
			holds = append(holds, v)
		}
		for i := range 3 {
			if holds[i] != holds[(i+1)%3] && holds[i] != holds[(i+2)%3] {
				pick = i // the odd one out
			}
		}
		resume := srvs[pick].Pause(t)
		all, _ := r.waitTerms(3*ttl, func(all []leadTerm) bool { return len(all) > len(before) || !all[len(before)-1].end.IsZero() })
		resume()
		if len(all) != len(before) || !all[len(before)-1].end.IsZero() {
			t.Errorf("round %d: with node %d of three paused (holding %q), %s's term (token %d) ended: %v", round, pick, holds, cur.who, cur.token, all[len(before)-1].cause)
		}
		before = r.terms()
		cur = before[len(before)-1]
		r1, r2 := srvs[round%3].Pause(t), srvs[(round+1)%3].Pause(t)
		paused := time.Now()
		all, ok := r.waitTerms(ttl+5*time.Second, func(all []leadTerm) bool { return !all[len(before)-1].end.IsZero() })
		r1()
		r2()
		if !ok {
			t.Fatalf("round %d: %s (token %d) still leads %v after two nodes of three were paused (lease %v)", round, cur.who, cur.token, time.Since(paused), ttl)
		}
		if len(all) != len(before) {
			t.Fatalf("round %d: %d terms began while a majority was paused", round, len(all)-len(before))
		}
		all, ok = r.waitTerms(15*time.Second, func(all []leadTerm) bool { return len(all) > len(before) })
		if !ok {
			t.Fatalf("round %d: no leader within 15 s of SIGCONT", round)
		}
		ended := all[len(before)-1]
		t.Logf("round %d: %s's term ended %v after the pause (%v); %s leads %v after the pause", round, ended.who, ended.end.Sub(paused), ended.cause, all[len(before)].who, all[len(before)].start.Sub(paused))
		if ended.end.After(paused) && !errors.Is(ended.cause, fence.ErrLeaseLost) {
			t.Errorf("round %d: the leader's fn saw %v, want ErrLeaseLost", round, ended.cause)
		}
	}
	cancel()
	wg.Wait()
	r.check(t)
}
