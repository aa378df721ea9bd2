package fence_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// On a real Redis: when the leader's lock is deleted, the other candidate
// leads within the lease time (plus slack for a busy machine), and the
// deposed fn sees ErrLeaseLost; when the leader steps down, its fn has
// returned before the next one starts.
func TestLeadRedis(t *testing.T) {
	const ttl = 300 * time.Millisecond
	const slack = 500 * time.Millisecond
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
	for i := 1; i <= 5; i++ {
		removed := time.Now()
		if n, err := admin.Del(t.Context(), "fence:{leader}").Result(); err != nil || n != 1 {
			t.Fatalf("DEL = %d, %v", n, err)
		}
		all := waitTerms(i+1, ttl+slack)
		if lag := all[i].start.Sub(removed); lag > ttl+slack {
			t.Fatalf("new leader after %v", lag)
		}
		t.Logf("removal %d: new leader %s after %v", i, all[i].who, all[i].start.Sub(removed))
	}
	// Normal hand-over: the leader steps down.
	all := waitTerms(6, 0)
	leader := all[5].who
	r.mu.Lock()
	n := len(r.log)
	r.mu.Unlock()
	cancels[leader]()
	waitTerms(7, 5*time.Second)
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
	if a, b := all[5], all[6]; b.start.Before(a.end) {
		t.Errorf("after the step-down, %s started at %v before %s's term ended at %v", b.who, b.start, a.who, a.end)
	}
	for _, tm := range all[:5] {
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
	const slack = 500 * time.Millisecond
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
	close(resume)
	all := r.check(t) // a's lease ended before b started
	t.Logf("b leads %v after a paused (lease %v)", all[1].start.Sub(paused), ttl)
	cancel()
	wg.Wait()
	if all := r.check(t); !errors.Is(all[0].cause, fence.ErrLeaseLost) {
		t.Fatalf("the paused fn woke to cause %v, want ErrLeaseLost", all[0].cause)
	}
}
