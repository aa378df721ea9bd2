package fence_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// On a real Redis: when the leader's lock is deleted, the other candidate
// leads within the lease time (plus slack for a busy machine), and the
// deposed fn sees ErrLeaseLost; when the leader steps down, its fn has
// returned before the next one starts.
func TestLeadRedis(t *testing.T) {
	const ttl = 300 * time.Millisecond
	const slack = 3 * time.Second // a loaded machine; a waiter never woken waits out Lead's campaign (30 s)
	srv := redistest.Start(t)
	admin := srv.Client(t)
	var r terms
	var wg sync.WaitGroup
	cancels := map[string]context.CancelFunc{}
	for _, who := range []string{"a", "b"} {
		l, err := redislock.New(srv.Client(t), &redislock.Options{WatchdogTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancels[who] = cancel
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "leader", r.fn(who, nil), fence.Backoff(50*time.Millisecond, time.Second))
		})
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
		wg.Wait()
	}()
	waitTerms := func(n int, within time.Duration) []*term {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			r.mu.Lock()
			all := append([]*term(nil), r.all...)
			r.mu.Unlock()
			if len(all) >= n {
				return all
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d terms after %v, want %d", len(all), within, n)
			}
			time.Sleep(5 * time.Millisecond) // polling with a deadline
		}
	}
	waitTerms(1, 5*time.Second)
	// A removal deletes the lock only while the last term to begin holds
	// the newest token: once a newer one was issued, the lock is an
	// acquisition's whose term has not begun (its fn would then start for
	// a lock already deleted, and the next removal find none: "removal 1:
	// new leader a after 37ms", then DEL = 0, in a loaded run). That
	// happens when a term's lease ends by itself: a lease can come back
	// from Acquire already past its deadline when the try that took the
	// lock was answered more than the 300 ms lease time after it was sent
	// (see TestRunLeaseEndedBeforeFn), or its renewals can fail on a
	// loaded machine; Run's Release then frees the lock (owner-checked)
	// for the other candidate. Such a removal is not counted.
	remove := redis.NewScript(`if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
return redis.call('DEL', KEYS[1])`)
	selfEnded := 0
	for i := 1; i <= 5; {
		r.mu.Lock()
		n := len(r.all)
		cur := r.all[n-1]
		r.mu.Unlock()
		if selfEnded > 5 {
			t.Fatalf("removal %d: %d terms ended by themselves", i, selfEnded)
		}
		removed := time.Now()
		deleted, err := remove.Run(t.Context(), admin, []string{"fence:{leader}", "fence:{leader}:token"}, int64(cur.token)).Int()
		switch {
		case err != nil:
			t.Fatal(err)
		case deleted == -1:
			selfEnded++
			t.Logf("removal %d: a newer token than %s's %d was issued (its lease: %v); not removed", i, cur.who, cur.token, cur.lease.Err())
			waitTerms(n+1, 5*time.Second)
			continue
		case deleted == 0:
			// The newest token's lock is gone, and nobody removed it:
			// only the lease's own end, at its deadline, may have
			// freed it (its expiry timer may not have run yet).
			lerr := cur.lease.Err()
			for end := time.Now().Add(ttl + slack); lerr == nil && time.Now().Before(end); lerr = cur.lease.Err() {
				time.Sleep(5 * time.Millisecond) // polling with a deadline
			}
			if !errors.Is(lerr, fence.ErrLeaseLost) || !strings.Contains(lerr.Error(), "deadline") {
				t.Fatalf("removal %d: no lock while %s holds the newest token, %d (its term began %v ago); its lease: %v", i, cur.who, cur.token, time.Since(cur.start), lerr)
			}
			selfEnded++
			t.Logf("removal %d: no lock: %s's lease (token %d) ended by itself %v into its term: %v", i, cur.who, cur.token, time.Since(cur.start), lerr)
			waitTerms(n+1, 5*time.Second)
			continue
		}
		all := waitTerms(n+1, ttl+slack)
		if lag := all[n].start.Sub(removed); lag > ttl+slack {
			t.Fatalf("new leader after %v", lag)
		}
		t.Logf("removal %d: new leader %s after %v", i, all[n].who, all[n].start.Sub(removed))
		i++
	}
	// Normal hand-over: the leader steps down.
	all := waitTerms(6+selfEnded, 0)
	k := len(all) - 1 // the leader's term
	leader := all[k].who
	r.mu.Lock()
	n := len(r.log)
	r.mu.Unlock()
	cancels[leader]()
	waitTerms(k+2, 5*time.Second)
	r.mu.Lock()
	log := r.log[n:]
	r.mu.Unlock()
	if want := []string{leader + " cancelled", leader + " return"}; len(log) < 3 || log[0] != want[0] || log[1] != want[1] {
		t.Fatalf("events after %s stepped down: %v, want %v then the next start", leader, log, want)
	}
	// After a deletion the deposed leader learns of it at its next renewal,
	// so terms may overlap there (the tokens tell them apart); after a
	// step-down they must not.
	r.mu.Lock()
	all = append([]*term(nil), r.all...)
	r.mu.Unlock()
	for i := 1; i < len(all); i++ {
		if all[i].token <= all[i-1].token {
			t.Errorf("token %d after %d", all[i].token, all[i-1].token)
		}
	}
	if a, b := all[k], all[k+1]; b.start.Before(a.end) {
		t.Errorf("after the step-down, %s started at %v before %s's term ended at %v", b.who, b.start, a.who, a.end)
	}
	for _, tm := range all[:k] {
		if !errors.Is(tm.cause, fence.ErrLeaseLost) {
			t.Errorf("%s token %d: fn's cause %v, want ErrLeaseLost", tm.who, tm.token, tm.cause)
		}
	}
}

// On a real Redis, a leader that stops extending its fixed lease (a paused
// process) is replaced within the lease time plus slack; its lease ends, by
// its own deadline, before the next leader starts; and when it wakes, its
// fn finds its context cancelled with ErrLeaseLost.
func TestLeadRedisPausedLeader(t *testing.T) {
	const ttl = 500 * time.Millisecond
	// A loaded machine, yet under the 2 s that a waiter waking at a floor
	// of its own rather than at the holder's expiry would take.
	const slack = time.Second
	srv := redistest.Start(t)
	var r terms
	resume := make(chan struct{})
	var paused time.Time
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); wg.Wait() }()
	l, err := redislock.New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	elected := make(chan struct{})
	wg.Go(func() {
		first := true
		_ = fence.Lead(ctx, l, "leader", r.fn("a", func() error {
			if first {
				first = false
				paused = time.Now()
				close(elected)
				<-resume // paused: no Extend, and fn does not look at its ctx
			}
			return nil
		}), fence.LeaseOptions(fence.TTL(ttl)))
	})
	<-elected
	l2, err := redislock.New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		_ = fence.Lead(ctx, l2, "leader", r.fn("b", nil), fence.LeaseOptions(fence.TTL(10*time.Second)))
	})
	deadline := time.Now().Add(ttl + slack)
	for {
		r.mu.Lock()
		n := len(r.all)
		r.mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader %v after the leader paused", ttl+slack)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	// a's lease ends by its deadline while fn is still paused (its end
	// is seen by the AfterFunc on its context, not by fn's return).
	if !waitFor(slack, func() bool { return r.ended(r.snapshot()[0]) }) {
		t.Errorf("the paused leader's term has not ended %v after b started", slack)
	}
	close(resume)
	all := r.check(t) // a's lease ended before b started
	t.Logf("b leads %v after a paused (lease %v)", all[1].start.Sub(paused), ttl)
	cancel()
	wg.Wait()
	if all := r.check(t); !errors.Is(all[0].cause, fence.ErrLeaseLost) {
		t.Fatalf("the paused fn woke to cause %v, want ErrLeaseLost", all[0].cause)
	}
}
