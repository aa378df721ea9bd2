package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	"github.com/fencekit/fence/internal/stresstest"
)

// Three candidates, each on a client of its own, campaign on a standalone
// etcd; the server is paused (SIGSTOP) under the leader, past the lease
// time, three times. The leader's fn must see its context end while the
// server is still stopped (nobody can be elected then), with a cause
// matching ErrLeaseLost; after SIGCONT a leader is elected again, with a
// greater token, after every earlier term ended.
func TestLeadServerPausedPastTTL(t *testing.T) {
	const ttl = 2 * time.Second
	c := etcdtest.Start(t)
	var r stresstest.TermLog
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, who := range []string{"a", "b", "c"} {
		l := newLocker(t, c.Endpoints(), &etcdlock.Options{WatchdogTTL: ttl})
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "paused", r.Fn(who), fence.Backoff(20*time.Millisecond, 200*time.Millisecond),
				fence.LeaseOptions(fence.Wait(5*time.Second)))
		})
	}
	if _, ok := r.WaitTerms(10*time.Second, func(all []stresstest.Term) bool { return len(all) > 0 }); !ok {
		t.Fatal("no leader within 10 s")
	}
	m := c.Members[0]
	for round := 1; round <= 3; round++ {
		before := r.Terms()
		cur := before[len(before)-1]
		m.Stop()
		paused := time.Now()
		all, ok := r.WaitTerms(ttl+5*time.Second, func(all []stresstest.Term) bool { return !all[len(before)-1].End.IsZero() })
		m.Cont()
		if !ok {
			t.Fatalf("round %d: %s (token %d) still leads %v after the server was paused (lease %v)", round, cur.Who, cur.Token, time.Since(paused), ttl)
		}
		if len(all) != len(before) {
			t.Fatalf("round %d: %d terms began while the server was paused", round, len(all)-len(before))
		}
		all, ok = r.WaitTerms(15*time.Second, func(all []stresstest.Term) bool { return len(all) > len(before) })
		if !ok {
			t.Fatalf("round %d: no leader within 15 s of SIGCONT", round)
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
