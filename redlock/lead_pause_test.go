package redlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/stresstest"
	"github.com/fencekit/fence/redlock"
)

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
	var r stresstest.TermLog
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, who := range []string{"a", "b", "c"} {
		l, err := redlock.New(clients(t, srvs), &redlock.Options{WatchdogTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
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
		all, _ := r.WaitTerms(3*ttl, func(all []stresstest.Term) bool { return len(all) > len(before) || !all[len(before)-1].End.IsZero() })
		resume()
		if len(all) != len(before) || !all[len(before)-1].End.IsZero() {
			t.Errorf("round %d: with node %d of three paused (holding %q), %s's term (token %d) ended: %v", round, pick, holds, cur.Who, cur.Token, all[len(before)-1].Cause)
		}
		before = r.Terms()
		cur = before[len(before)-1]
		r1, r2 := srvs[round%3].Pause(t), srvs[(round+1)%3].Pause(t)
		paused := time.Now()
		all, ok := r.WaitTerms(ttl+5*time.Second, func(all []stresstest.Term) bool { return !all[len(before)-1].End.IsZero() })
		r1()
		r2()
		if !ok {
			t.Fatalf("round %d: %s (token %d) still leads %v after two nodes of three were paused (lease %v)", round, cur.Who, cur.Token, time.Since(paused), ttl)
		}
		if len(all) != len(before) {
			t.Fatalf("round %d: %d terms began while a majority was paused", round, len(all)-len(before))
		}
		all, ok = r.WaitTerms(15*time.Second, func(all []stresstest.Term) bool { return len(all) > len(before) })
		if !ok {
			t.Fatalf("round %d: no leader within 15 s of SIGCONT", round)
		}
		ended := all[len(before)-1]
		t.Logf("round %d: %s's term ended %v after the pause (%v); %s leads %v after the pause", round, ended.Who, ended.End.Sub(paused), ended.Cause, all[len(before)].Who, all[len(before)].Start.Sub(paused))
		if ended.End.After(paused) && !errors.Is(ended.Cause, fence.ErrLeaseLost) {
			t.Errorf("round %d: the leader's fn saw %v, want ErrLeaseLost", round, ended.Cause)
		}
	}
	cancel()
	wg.Wait()
	r.Check(t)
}
