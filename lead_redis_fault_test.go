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
	"github.com/redis/go-redis/v9"
)

// waitFor polls cond until it holds or within has passed (a short poll
// loop with a deadline), and reports whether it held.
func waitFor(within time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(within); ; time.Sleep(5 * time.Millisecond) { // polling with a deadline
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func (r *terms) snapshot() []*term {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*term(nil), r.all...)
}

func (r *terms) ended(tm *term) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !tm.end.IsZero()
}

// Three candidates, each with its own client, campaign on one real Redis;
// the server is paused (SIGSTOP) under the leader, past its lease time,
// three times. Each time the leader's fn must see its context end (by its
// lease's own deadline: no renewal can get through) while the server is
// still stopped, so before anyone can be elected; after SIGCONT a leader
// must be elected again, with a greater token, its term starting after
// every earlier term ended.
func TestLeadRedisServerPausedPastTTL(t *testing.T) {
	const ttl = 400 * time.Millisecond
	srv := redistest.Start(t)
	var r terms
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, who := range []string{"a", "b", "c"} {
		l, err := redislock.New(srv.Client(t), &redislock.Options{WatchdogTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "paused", r.fn(who, nil), fence.Backoff(20*time.Millisecond, 200*time.Millisecond))
		})
	}
	if !waitFor(5*time.Second, func() bool { return len(r.snapshot()) > 0 }) {
		t.Fatal("no leader within 5 s")
	}
	for round := 1; round <= 3; round++ {
		all := r.snapshot()
		cur := all[len(all)-1]
		resume := srv.Pause(t)
		paused := time.Now()
		if !waitFor(ttl+2*time.Second, func() bool { return r.ended(cur) }) {
			resume()
			t.Fatalf("round %d: %s (token %d) still leads %v after the server was paused (lease %v)", round, cur.who, cur.token, time.Since(paused), ttl)
		}
		ended := r.snapshot()
		resume()
		if len(ended) != len(all) {
			t.Fatalf("round %d: %d terms began while the server was paused", round, len(ended)-len(all))
		}
		if !waitFor(5*time.Second, func() bool { return len(r.snapshot()) > len(all) }) {
			t.Fatalf("round %d: no leader within 5 s of SIGCONT", round)
		}
		next := r.snapshot()[len(all)]
		t.Logf("round %d: %s's term ended %v after the pause; %s leads %v after the pause", round, cur.who, cur.end.Sub(paused), next.who, next.start.Sub(paused))
	}
	cancel()
	wg.Wait()
	for _, tm := range r.check(t) {
		if tm.cause != nil && !errors.Is(tm.cause, fence.ErrLeaseLost) && !errors.Is(tm.cause, context.Canceled) {
			t.Errorf("%s token %d: fn's cause %v", tm.who, tm.token, tm.cause)
		}
	}
}

// The leader's link to Redis goes deaf (its requests for the lock are held
// back, as by a partition, while the others' get through): its renewals
// never arrive, its lease must end by its own deadline, and only then may
// another candidate lead (the lock expires on the server after that
// deadline). Then the held requests arrive late, renewals and a campaign
// among them, while the new leader holds the lock: they must not take it
// from the new leader or end its term.
func TestLeadRedisLeaderLinkDeaf(t *testing.T) {
	const ttl = 400 * time.Millisecond
	srv := redistest.Start(t)
	var r terms
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	holders := map[string]*redistest.Holder{}
	for _, who := range []string{"a", "b", "c"} {
		h := redistest.NewHolder("fence:{deaf}")
		holders[who] = h
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: h.Dial})
		t.Cleanup(func() { _ = c.Close() })
		l, err := redislock.New(c, &redislock.Options{WatchdogTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "deaf", r.fn(who, nil), fence.Backoff(20*time.Millisecond, 200*time.Millisecond))
		})
	}
	if !waitFor(5*time.Second, func() bool { return len(r.snapshot()) > 0 }) {
		t.Fatal("no leader within 5 s")
	}
	first := r.snapshot()[0]
	h := holders[first.who]
	h.Arm()
	deaf := time.Now()
	if !waitFor(ttl+5*time.Second, func() bool { return len(r.snapshot()) > 1 }) {
		t.Fatalf("no new leader %v after %s's link went deaf", time.Since(deaf), first.who)
	}
	second := r.snapshot()[1]
	// first's lease ends by its deadline, before any held request is let
	// through (a late renewal's refusal would end it too, and hide an
	// expiry that came late).
	if !waitFor(time.Second, func() bool { return r.ended(first) }) {
		t.Fatalf("%s's term has not ended a second after %s's began", first.who, second.who)
	}
	t.Logf("%s's term ended %v after its link went deaf; %s leads %v after", first.who, first.end.Sub(deaf), second.who, second.start.Sub(deaf))
	if !waitFor(5*time.Second, func() bool { return h.Held() > 0 }) {
		t.Fatal("nothing held")
	}
	h.Disarm()
	held := h.Held()
	if err := h.Let(); err != nil {
		t.Logf("letting the held writes through: %v", err)
	}
	// The late requests have arrived (or their connections were closed);
	// give the server a round trip on a connection of its own and check
	// the new leader still leads.
	admin := srv.Client(t)
	if err := admin.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	all := r.snapshot()
	if len(all) != 2 || r.ended(second) {
		t.Errorf("after %d held requests arrived late: %d terms, %s's ended: %v", held, len(all), second.who, second.lease.Err())
	}
	cancel()
	wg.Wait()
	r.check(t)
}

// Three candidates share one Locker (and its client, its subscription and
// its local waiters) and a fourth has a Locker of its own; each term's fixed
// lease runs out (fn waits for its context only), so the lock changes hands
// by expiry, through the Locker's local hand-over as well as across
// Lockers. No term may begin before the one before it ended, and tokens
// must grow.
func TestLeadRedisSharedLockerExpiryChurn(t *testing.T) {
	const ttl = 150 * time.Millisecond
	srv := redistest.Start(t)
	var r terms
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	shared, err := redislock.New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	own, err := redislock.New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for who, l := range map[string]*redislock.Locker{"a": shared, "b": shared, "c": shared, "d": own} {
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "churn", r.fn(who, nil), fence.Backoff(time.Millisecond, 20*time.Millisecond),
				fence.LeaseOptions(fence.TTL(ttl)))
		})
	}
	const want = 15
	if !waitFor(want*ttl+10*time.Second, func() bool { return len(r.snapshot()) >= want }) {
		t.Fatalf("%d terms, want %d", len(r.snapshot()), want)
	}
	cancel()
	wg.Wait()
	for _, tm := range r.check(t) {
		if tm.cause != nil && !errors.Is(tm.cause, fence.ErrLeaseLost) && !errors.Is(tm.cause, context.Canceled) {
			t.Errorf("%s token %d: fn's cause %v", tm.who, tm.token, tm.cause)
		}
	}
}
