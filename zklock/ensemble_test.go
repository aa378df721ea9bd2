package zklock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// Tokens strictly increase across holders and across the ensemble's leader
// being killed while a lock is held and waiters wait; the token taken after
// the election carries the new epoch.
func TestTokensAcrossLeaderKill(t *testing.T) {
	e := startEnsemble(t, 3)
	addrs := e.Addrs()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const name = "leader-kill"
	// Sessions of 8 s (the servers allow 10): the claim is that a session
	// outlives an election that ends within its timeout. With the suite's
	// 2 s, an election on a loaded machine (ci83, load 20) took longer:
	// the holder saw no reply for a session timeout and, rightly, reported
	// its lease lost.
	const session = 8 * time.Second
	holder, _ := newLockerFor(t, addrs, nil, session)
	first, err := holder.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	admin := connect(t, addrs, nil)
	type result struct {
		lease fence.Lease
		err   error
	}
	results := make(chan result, 2)
	for i := range 2 {
		l, _ := newLockerFor(t, addrs, nil, session)
		go func() {
			lease, err := l.Acquire(ctx, name, fence.Wait(45*time.Second))
			results <- result{lease, err}
		}()
		// The waiters queue in order: wait for this one's node.
		waitFor(t, func() bool { return len(lockNodes(t, admin, name)) == i+2 })
	}
	leader, err := e.Leader(e.ElectionLimit())
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	if _, err := e.Leader(e.ElectionLimit()); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatalf("Release after the election: %v (the session and its node survive it)", err)
	}
	tokens := []fence.Token{first.Token()}
	for range 2 {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		tokens = append(tokens, r.lease.Token())
		if err := r.lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	after, err := holder.Acquire(ctx, name, fence.Wait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	tokens = append(tokens, after.Token())
	if err := after.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens %#x: token %d is not greater than the one before", tokens, i)
		}
	}
	if epoch := func(tok fence.Token) int64 { return int64(tok) >> 32 }; epoch(after.Token()) <= epoch(first.Token()) {
		t.Fatalf("token after the election %#x has the epoch of %#x", after.Token(), first.Token())
	}
	t.Logf("tokens %#x", tokens)
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	waitWithin(t, 10*time.Second, cond)
}

// waitWithin is waitFor with a bound of d.
func waitWithin(t testing.TB, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("condition not met after %v", d)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}
