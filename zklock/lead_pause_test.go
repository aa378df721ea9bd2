package zklock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/stresstest"
)

// Three candidates, each on a session of its own, campaign on a standalone
// ZooKeeper; the server is paused (SIGSTOP) under the leader, past the
// session timeout, three times. The leader's fn must see its context end
// while the server is still stopped (nobody can be elected then), with a
// cause matching ErrLeaseLost; after SIGCONT a leader is elected again,
// with a greater token, after every earlier term ended.
func TestLeadServerPausedPastTTL(t *testing.T) {
	srv := startZK(t)
	var r stresstest.TermLog
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, who := range []string{"a", "b", "c"} {
		l, _ := newLocker(t, []string{srv.Addr})
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "paused", r.Fn(who), fence.Backoff(20*time.Millisecond, 200*time.Millisecond),
				fence.LeaseOptions(fence.Wait(5*time.Second)))
		})
	}
	if _, ok := r.WaitTerms(10*time.Second, func(all []stresstest.Term) bool { return len(all) > 0 }); !ok {
		t.Fatal("no leader within 10 s")
	}
	for round := 1; round <= 3; round++ {
		before := r.Terms()
		cur := before[len(before)-1]
		srv.Stop()
		paused := time.Now()
		all, ok := r.WaitTerms(sessionTimeout+5*time.Second, func(all []stresstest.Term) bool { return !all[len(before)-1].End.IsZero() })
		srv.Cont()
		if !ok {
			t.Fatalf("round %d: %s (token %d) still leads %v after the server was paused (session timeout %v)", round, cur.Who, cur.Token, time.Since(paused), sessionTimeout)
		}
		if len(all) != len(before) {
			t.Fatalf("round %d: %d terms began while the server was paused", round, len(all)-len(before))
		}
		all, ok = r.WaitTerms(20*time.Second, func(all []stresstest.Term) bool { return len(all) > len(before) })
		if !ok {
			t.Fatalf("round %d: no leader within 20 s of SIGCONT", round)
		}
		ended := all[len(before)-1]
		t.Logf("round %d: %s's term ended %v after the pause (%v); %s leads %v after the pause", round, ended.Who, ended.End.Sub(paused), ended.Cause, all[len(before)].Who, all[len(before)].Start.Sub(paused))
		if ended.End.After(paused) && !errors.Is(ended.Cause, fence.ErrLeaseLost) {
			t.Errorf("round %d: the paused leader's fn saw %v, want ErrLeaseLost", round, ended.Cause)
		}
	}
	cancel()
	wg.Wait()
	r.Check(t)
}

// Three candidates on sessions of their own; the leader's host is cut off
// from ZooKeeper (its connections closed, new ones refused) while the
// others still reach it. Its fn must see its context end, with
// ErrLeaseLost, before another candidate's term begins (ZooKeeper hands the
// lock on only when the cut-off session expires); when the partition heals
// the old leader campaigns again without disturbing the new one.
func TestLeadLeaderPartitioned(t *testing.T) {
	srv := startZK(t)
	var r stresstest.TermLog
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	parts := map[string]*partition{}
	for _, who := range []string{"a", "b", "c"} {
		p := &partition{}
		parts[who] = p
		l := newLockerDialer(t, []string{srv.Addr}, p.dial)
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "partitioned", r.Fn(who), fence.Backoff(20*time.Millisecond, 200*time.Millisecond),
				fence.LeaseOptions(fence.Wait(5*time.Second)))
		})
	}
	all, ok := r.WaitTerms(10*time.Second, func(all []stresstest.Term) bool { return len(all) > 0 })
	if !ok {
		t.Fatal("no leader within 10 s")
	}
	first := all[0]
	parts[first.Who].set(true)
	cut := time.Now()
	all, ok = r.WaitTerms(3*sessionTimeout+5*time.Second, func(all []stresstest.Term) bool { return len(all) > 1 })
	if !ok {
		t.Fatalf("no new leader %v after %s was cut off", time.Since(cut), first.Who)
	}
	t.Logf("%s's term ended %v after the cut (%v); %s leads %v after it", first.Who, all[0].End.Sub(cut), all[0].Cause, all[1].Who, all[1].Start.Sub(cut))
	if !errors.Is(all[0].Cause, fence.ErrLeaseLost) {
		t.Errorf("the cut-off leader's fn saw %v, want ErrLeaseLost", all[0].Cause)
	}
	parts[first.Who].set(false)
	second := all[1]
	// The healed candidate reconnects (its session expired: go-zookeeper
	// makes a new one) and waits in line; the new leader goes on.
	if all, _ := r.WaitTerms(2*sessionTimeout, func(all []stresstest.Term) bool { return len(all) > 2 || !all[1].End.IsZero() }); len(all) > 2 || !all[1].End.IsZero() {
		t.Errorf("after the partition healed, %s's term ended (%v) or a new one began (%d terms)", second.Who, all[1].Cause, len(all))
	}
	cancel()
	wg.Wait()
	r.Check(t)
}
