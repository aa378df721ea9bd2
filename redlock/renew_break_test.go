package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// A lease granted on nodes 0 and 1 of 3, its acquisition on node 2 lost on
// the way (so node 2 is one whose grant never came, and Release revokes
// it). The lease then loses node 0 (its lock gone, as after a restart
// without persistence), and another Locker acquires on nodes 0 and 2, a
// majority, while the first lease says held. The first lease's Release deletes its lock only on node
// 1: node 2 answers 0 because the other owner holds it there, which is no
// free node. Release must report the lease lost (only one node still held
// it), not nil.
func TestReleaseRevokedNodeHeldByOtherIsNotFreed(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "release-revoked-taken", 30 * time.Second
	l, drop := droppingLocker(t, srvs, name, ttl)
	other := lateLocker(t, srvs, name)
	drop.armed.Store(true)
	lease := acquireFast(t, l, name, ttl)
	if on := lockedOn(t, srvs, name); len(on) != 2 || on[1] != 1 {
		t.Fatalf("locked on %v, want nodes 0 and 1", on)
	}
	// Node 0 loses the lease's lock.
	if err := srvs[0].Client(t).Del(ctxFor(t), lockKey(name)).Err(); err != nil {
		t.Fatal(err)
	}
	taker := acquireFast(t, other, name, ttl)
	defer func() { _ = taker.Release(ctxFor(t)) }()
	if lease.Err() != nil {
		t.Fatalf("first lease ended before Release: %v", lease.Err())
	}
	err := lease.Release(ctxFor(t))
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of a lease whose lock another Locker holds on nodes 0 and 2 = %v, want ErrLeaseLost", err)
	}
	if taker.Err() != nil {
		t.Fatalf("the other lease ended: %v", taker.Err())
	}
}

// A renewal is held on its way to every node; meanwhile another Extend
// waits its turn, a third with a short context gives up waiting, and
// Release runs (it takes no turn). Release must return nil at once (it
// deletes the lock on every node), the waiting Extend, once the held
// renewal finds the lock gone, must return the lease's end (not renew it),
// the held one an error matching fence.ErrReleased, nothing is left locked
// and no goroutine leaks (goleak in TestMain).
func TestReleaseWhileRenewalWaitsItsTurn(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "release-while-waiting", 10 * time.Second
	l, gates := gatedLocker(t, srvs)
	ctx := ctxFor(t)
	lease := warmLease(t, l, name, ttl)
	for _, g := range gates {
		g.hold.Store(true)
	}
	first := make(chan error, 1)
	go func() { first <- lease.Extend(ctx, ttl) }()
	for _, g := range gates {
		select {
		case <-g.held:
		case <-time.After(5 * time.Second):
			t.Fatal("the first renewal was not sent")
		}
	}
	second := make(chan error, 1)
	go func() { second <- lease.Extend(context.Background(), ttl) }()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := lease.Extend(short, ttl); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Extend waiting its turn past its context = %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Extend waiting its turn took %v to give up (context 50ms)", took)
	}
	start = time.Now()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release while a renewal is held and another waits: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Release took %v: it waited for the renewals", took)
	}
	// Release returns once a majority has deleted the lock; the last
	// node's delete may still be on its way.
	waitUnlocked(t, srvs, name, 5*time.Second)
	select {
	case err := <-second:
		t.Fatalf("the waiting Extend returned %v before the held renewal ended", err)
	default:
	}
	for _, g := range gates {
		close(g.open)
	}
	if err := <-first; !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("held Extend = %v, want ErrReleased", err)
	}
	select {
	case err := <-second:
		if !errors.Is(err, fence.ErrReleased) {
			t.Fatalf("waiting Extend = %v, want ErrReleased", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting Extend never got its turn")
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("locked on %v after the renewals", on)
	}
}

// A renewal that moves the lock on one node of three (the other two
// requests lost on the way) fails with ErrNoQuorum and moves nothing: the
// lease stays held with its Deadline, which the lock on a majority
// outlasts; a renewal that then moves a majority moves it, and the
// Deadline still never lies past the lock's expiry on a majority.
func TestRenewalOnMinorityLeavesDeadline(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "renew-minority", 5 * time.Second
	gates := make([]*gateExtend, len(srvs))
	for i := range gates {
		gates[i] = newGateExtend()
	}
	cs := clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, gates[0], gates[1], gates[2])
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	ctx := ctxFor(t)
	lease := warmLease(t, l, name, ttl)
	check := func(when string) {
		t.Helper()
		deadline := lease.Deadline()
		outlast := 0
		for _, s := range srvs {
			expiry, ok := latestExpiry(ctx, s.Client(t), lockKey(name))
			if !ok {
				t.Fatalf("PTTL on %s failed", s.Addr)
			}
			if !expiry.Before(deadline) {
				outlast++
			}
		}
		if outlast < l.Quorum() {
			t.Fatalf("%s: Deadline %v ahead outlasts the lock on all but %d nodes", when, time.Until(deadline), outlast)
		}
	}
	before := lease.Deadline()
	gates[1].drop.Store(true)
	gates[2].drop.Store(true)
	err = lease.Extend(ctx, 4*ttl)
	if !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Extend moved on one node = %v, want ErrNoQuorum", err)
	}
	if lease.Err() != nil {
		t.Fatalf("lease ended by a renewal that reached one node: %v", lease.Err())
	}
	if got := lease.Deadline(); !got.Equal(before) {
		t.Fatalf("Deadline moved from %v to %v by a renewal on one node", before, got)
	}
	check("after a renewal on one node")
	gates[2].drop.Store(true)
	if err := lease.Extend(ctx, 4*ttl); err != nil {
		t.Fatalf("Extend on two nodes: %v", err)
	}
	check("after a renewal on two nodes")
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A renewal sent before the deadline runs on every node in time (each
// moves the lock), but its replies are read just as the expiry timer
// fires at the deadline. The renewal moved the lock on a majority and
// Extend returns nil: the lease must be held with the new Deadline, not
// ended by the timer a moment later (leaving the lock held on every node
// for the new lease time by nobody, after Extend said renewed).
func TestExpiryFiringAsRenewalLandsKeepsLease(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "expiry-as-renewal-lands", 600 * time.Millisecond
	l, gates := gatedLocker(t, srvs)
	ctx := ctxFor(t)
	lease := warmLease(t, l, name, ttl)
	extended := make(chan error, 1)
	landed := make(chan struct{}) // closed once Extend returned
	fired := make(chan struct{})
	redlock.SetExpiryFired(l, func() {
		close(fired)
		// The renewal's replies are read now.
		for _, g := range gates {
			close(g.open)
		}
		select {
		case <-landed:
		case <-time.After(5 * time.Second):
		}
	})
	done := lease.Done() // arms the expiry timer
	for _, g := range gates {
		g.late.Store(true)
	}
	const longer = 10 * time.Second
	go func() {
		extended <- lease.Extend(ctx, longer)
		close(landed)
	}()
	for _, g := range gates {
		select {
		case <-g.held:
		case <-time.After(5 * time.Second):
			t.Fatal("the renewal did not run")
		}
	}
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("the expiry timer did not fire")
	}
	if err := <-extended; err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 3 {
		t.Fatalf("locked on %v after the renewal, want every node", on)
	}
	select {
	case <-done:
		t.Fatalf("lease ended (%v) after Extend returned nil; the lock stays on every node for %v", lease.Err(), longer)
	case <-time.After(100 * time.Millisecond): // the timer's end, if it comes, is immediate
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("lease ended after Extend returned nil: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// A watchdog lease renewed by its watchdog while eight goroutines call
// Extend on it over and over: the renewals take turns, none deadlocks or
// ends the lease, and after each one that returns nil (and at the end) the
// lock on a majority outlasts the Deadline. Release then frees every node
// and nothing is left running.
func TestWatchdogAndManyExtends(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "watchdog-many-extends", 300 * time.Millisecond
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: ttl, NodeTimeout: generous})
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	ctx := ctxFor(t)
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	direct := make([]*redis.Client, len(srvs))
	for i, s := range srvs {
		direct[i] = s.Client(t)
	}
	outlasts := func() (int, time.Duration) {
		deadline := lease.Deadline()
		n := 0
		for _, c := range direct {
			if expiry, ok := latestExpiry(ctx, c, lockKey(name)); ok && !expiry.Before(deadline) {
				n++
			}
		}
		return n, time.Until(deadline)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if err := lease.Extend(ctx, ttl); err != nil {
					if lease.Err() != nil {
						errs <- fmt.Errorf("lease ended: %w (Extend: %v)", lease.Err(), err)
						return
					}
					continue // a renewal that failed (a slow machine) leaves the lease as it was
				}
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	for running := true; running; {
		select {
		case <-finished:
			running = false
		case <-time.After(20 * time.Millisecond):
		}
		if lease.Err() != nil {
			break
		}
		if n, ahead := outlasts(); n < l.Quorum() && lease.Err() == nil {
			t.Errorf("Deadline %v ahead outlasts the lock on all but %d nodes", ahead, n)
		}
	}
	select {
	case <-finished:
	case <-time.After(20 * time.Second):
		t.Fatal("Extends did not finish: renewals deadlocked")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if on := lockedOn(t, srvs, name); len(on) >= l.Quorum() {
		t.Fatalf("locked on %v after Release", on)
	}
}

// lateExtend is a hook on a node's client that, when armed, sends every
// renewal with the lease's deadline on the node's clock set to 1 ms (a
// mapping that erred very early): the node refuses it as late, before the
// deadline has passed by the holder's clock. It counts the renewals sent.
type lateExtend struct {
	armed atomic.Bool
	sent  atomic.Int32
}

func (h *lateExtend) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateExtend) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lateExtend) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		// The extend script, by EVALSHA or (not loaded yet) EVAL: the
		// only script with one key and three arguments.
		if len(a) == 7 && fmt.Sprint(a[2]) == "1" && h.armed.Load() {
			h.sent.Add(1)
			a[6] = int64(1)
		}
		return next(ctx, cmd)
	}
}

// A watchdog lease whose renewals are all refused as late on every node
// before its deadline: the refusals do not end it early (the lock stays on
// every node until it runs out), it ends at its Deadline, not later than
// the lock's expiry on a majority, and the watchdog stops renewing: the
// lock runs out and another Locker takes it.
func TestWatchdogRefusedLateEveryTime(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "watchdog-refused-late", 600 * time.Millisecond
	hooks := make([]*lateExtend, len(srvs))
	for i := range hooks {
		hooks[i] = &lateExtend{}
	}
	cs := clientsWith(t, srvs, redis.Options{}, hooks[0], hooks[1], hooks[2])
	l, err := redlock.New(cs, &redlock.Options{WatchdogTTL: ttl, NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	ctx := ctxFor(t)
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		h.armed.Store(true)
	}
	deadline := lease.Deadline()
	var expires []time.Time
	for _, s := range srvs {
		expiry, ok := latestExpiry(ctx, s.Client(t), lockKey(name))
		if !ok {
			t.Fatalf("PTTL on %s failed", s.Addr)
		}
		expires = append(expires, expiry)
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease never ended")
	}
	ended := time.Now()
	if ended.Before(deadline) {
		t.Fatalf("lease ended %v before its Deadline: %v", deadline.Sub(ended), lease.Err())
	}
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", lease.Err())
	}
	if got := lease.Deadline(); !got.Equal(deadline) {
		t.Fatalf("Deadline moved from %v to %v by refused renewals", deadline, got)
	}
	outlast := 0
	for _, e := range expires {
		if !e.Before(deadline) {
			outlast++
		}
	}
	if outlast < l.Quorum() {
		t.Fatalf("Deadline outlasts the lock on all but %d nodes", outlast)
	}
	sent := 0
	for _, h := range hooks {
		sent += int(h.sent.Load())
	}
	if sent < 3 {
		t.Fatalf("%d renewals sent before the deadline, want the watchdog's retries", sent)
	}
	waitUnlocked(t, srvs, name, 5*time.Second) // not renewed: the lock runs out on every node
	other := lateLocker(t, srvs, name)
	next := acquireFast(t, other, name, time.Second)
	if next.Token() <= lease.Token() {
		t.Fatalf("token %d after %d", next.Token(), lease.Token())
	}
	after := 0
	for _, h := range hooks {
		after += int(h.sent.Load())
	}
	select {
	case <-time.After(ttl): // the watchdog, were it running, would renew within ttl/12
	case <-ctx.Done():
	}
	last := 0
	for _, h := range hooks {
		last += int(h.sent.Load())
	}
	if last != after {
		t.Fatalf("%d renewals sent after the lease ended", last-after)
	}
	_ = next.Release(ctx)
}

// TestStaleRenewalDoesNotShortenLock: a renewal with a short lease is held
// up on its way to every node (a slow link) until Extend gave up on it; a
// later Extend with a long lease moves the lock and Deadline far ahead on a
// majority; then the old requests reach the nodes. Run as a plain PEXPIRE
// they cut the lock's expiry on every node to the short lease while
// Deadline still lay ahead: another Locker could take a majority inside
// the lease. The expiry on a node only ever moves later.
func TestStaleRenewalDoesNotShortenLock(t *testing.T) {
	srvs := nodes(t, 3)
	// 1234 ms, as the stale renewal's lease ms argument, on its own line of
	// the request: nothing else sends it.
	h := redistest.NewHolder("\r\n1234\r\n")
	o := lateOptions
	o.Dialer = h.Dial
	l, err := redlock.New(clientsWith(t, srvs, o), &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t), "stale-renewal", fence.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	h.Arm()
	short, cancel := context.WithTimeout(ctxFor(t), 200*time.Millisecond)
	err = lease.Extend(short, 1234*time.Millisecond)
	cancel()
	if err == nil || h.Held() != len(srvs) {
		t.Fatalf("the held renewal: Extend = %v with %d requests held; want an error and %d", err, h.Held(), len(srvs))
	}
	h.Disarm()
	if err := lease.Extend(ctxFor(t), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	before := make([]int, len(srvs))
	for i, s := range srvs {
		before[i] = evalshaCalls(t, s.Client(t))
	}
	if err := h.Let(); err != nil {
		t.Fatal(err)
	}
	// The held requests' replies come back to Locker's workers; wait until
	// every node has run its request: its script count goes up by one.
	for i, s := range srvs {
		admin := s.Client(t)
		deadline := time.Now().Add(5 * time.Second)
		for evalshaCalls(t, admin) == before[i] {
			if time.Now().After(deadline) {
				t.Fatalf("node %d: the held renewal did not run", i)
			}
			time.Sleep(5 * time.Millisecond) // polling with a deadline
		}
		pttl := admin.PTTL(ctxFor(t), lockKey("stale-renewal")).Val()
		if left := time.Until(lease.Deadline()); lease.Err() == nil && pttl < left {
			t.Errorf("node %d: the stale renewal cut the lock's expiry to %v while the lease's Deadline is %v away", i, pttl, left)
		}
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
}

// evalshaCalls is how many EVALSHA and EVAL calls the server has run (INFO
// commandstats).
func evalshaCalls(t testing.TB, c *redis.Client) int {
	t.Helper()
	stats, err := c.InfoMap(ctxFor(t), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, cmd := range []string{"cmdstat_evalsha", "cmdstat_eval"} {
		if v, ok := stats["Commandstats"][cmd]; ok {
			var calls int
			if _, err := fmt.Sscanf(v, "calls=%d", &calls); err == nil {
				n += calls
			}
		}
	}
	return n
}

// latestExpiry is the latest time at which key may expire on c's server, by
// this machine's clock (the servers' too): PTTL's reply, rounded down to a
// millisecond, counted from when the reply came. The PTTL was read earlier,
// by up to the round trip (a dial, a loaded machine's scheduling), so a
// lock whose latest expiry is before a lease's Deadline surely expired
// before it; counted from before the call, a slow round trip made a lock
// that outlasted the Deadline look as if it did not. ok is false if PTTL
// failed or the key has no expiry.
func latestExpiry(ctx context.Context, c *redis.Client, key string) (time.Time, bool) {
	d, err := c.PTTL(ctx, key).Result()
	if err != nil || d < 0 {
		return time.Time{}, false
	}
	return time.Now().Add(d + time.Millisecond), true
}
