package redlock_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// nodeMicros reads a node's clock, in microseconds.
func nodeMicros(t testing.TB, s *redistest.Server) int64 {
	t.Helper()
	now, err := s.Client(t).Time(ctxFor(t)).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now.UnixMicro()
}

// A client whose clock is an hour ahead must not push the name's tokens an
// hour ahead on every node: the nodes bound the client's floor to 2 s past
// their own clocks, and the next sane client's token is near the nodes'
// clocks, not an hour ahead of them.
func TestSkewedClientCannotInflateTokens(t *testing.T) {
	srvs := nodes(t, 3)
	skewed := newLocker(t, srvs, nil)
	redlock.SetWallClock(skewed, func() time.Time { return time.Now().Add(time.Hour) })
	const name = "skewed"
	a, err := skewed.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("Acquire with a clock an hour ahead: %v", err)
	}
	after := nodeMicros(t, srvs[0])
	const bound = 2*time.Second + time.Second // the cap, and room for the nodes' clocks and this test
	if ahead := time.Duration(int64(a.Token())-after) * time.Microsecond; ahead > bound {
		t.Fatalf("a client an hour ahead got token %d, %v ahead of the nodes' clock; want at most %v", a.Token(), ahead, bound)
	}
	if err := a.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	sane := newLocker(t, srvs, nil)
	b, err := sane.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer b.Release(ctxFor(t))
	if b.Token() <= a.Token() {
		t.Fatalf("token %d after %d", b.Token(), a.Token())
	}
	if ahead := time.Duration(int64(b.Token())-nodeMicros(t, srvs[0])) * time.Microsecond; ahead > bound {
		t.Fatalf("a sane client after a skewed one got a token %v ahead of the nodes' clock", ahead)
	}
	// The lease's token is on a majority of the nodes' records (those
	// that granted it by the time Acquire decided, the write-back told
	// the ones behind); a node that answered later keeps its own.
	var recs []int64
	holding := 0
	for i, s := range srvs {
		rec, err := s.Client(t).Get(ctxFor(t), lockKey(name)+":token").Int64()
		if err != nil {
			t.Fatalf("node %d's record: %v", i, err)
		}
		recs = append(recs, rec)
		if fence.Token(rec) == b.Token() {
			holding++
		}
	}
	if holding < sane.Quorum() {
		t.Fatalf("the nodes' records %v: %d hold the lease's token %d, want a majority", recs, holding, b.Token())
	}
}

// hangable returns clients to srvs that do not put the context's deadline
// on the socket: a request to a stopped node stays in its socket, and the
// node runs it when it wakes.
func hangable(t testing.TB, srvs []*redistest.Server) []redis.UniversalClient {
	t.Helper()
	cs := make([]redis.UniversalClient, len(srvs))
	for i, s := range srvs {
		cs[i] = s.Client(t)
	}
	return cs
}

// waitScripts waits until s has run at least n scripts, or fails.
func waitScripts(t testing.TB, s *redistest.Server, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for scriptCalls(t, s) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the node ran %d scripts, want %d", scriptCalls(t, s), n)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// A renewal that sits in a paused node's socket past the lease's deadline
// must be refused when it runs: moved then, it would hold the lock there
// for a full lease that nobody uses (here on a majority: every other
// client would be locked out for it). The lock's expiry on the two paused
// nodes is removed beforehand (a node whose clock stands still, as far as
// the key is concerned), so the late renewal finds the lock still there and
// the test sees whether it touched it.
func TestLateRenewalRefused(t *testing.T) {
	srvs := nodes(t, 3)
	l, err := redlock.New(hangable(t, srvs), &redlock.Options{NodeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const name = "late-renewal"
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(300*time.Millisecond))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	// Load the extend script on the nodes: a late EVALSHA of a script the
	// node does not know would be refused anyway.
	if err := lease.Extend(ctxFor(t), 300*time.Millisecond); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	stopped := srvs[1:]
	before := make([]int, len(stopped))
	for i, s := range stopped {
		if err := s.Client(t).Persist(ctxFor(t), lockKey(name)).Err(); err != nil {
			t.Fatal(err)
		}
		before[i] = scriptCalls(t, s)
		s.Signal(syscall.SIGSTOP)
		t.Cleanup(func() { s.Signal(syscall.SIGCONT) })
	}
	if err := lease.Extend(ctxFor(t), 10*time.Second); err == nil {
		t.Fatal("Extend with two of three nodes stopped succeeded")
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	for i, s := range stopped {
		s.Signal(syscall.SIGCONT)
		waitScripts(t, s, before[i]+1)
		pttl, err := s.Client(t).PTTL(ctxFor(t), lockKey(name)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pttl != -1 {
			t.Errorf("node %d: a renewal run after the lease's deadline set the lock's expiry to %v", i+1, pttl)
		}
	}
}

// A failed try is given back on the nodes that did not answer it; when
// the single release cannot even be sent (here the node's only connection
// is still busy with the try, the node being paused), the try runs when the
// node wakes and keeps the lock there for its lease time, for nobody,
// unless the release is retried. Two of three nodes are paused, so that a
// leftover lock on them would lock out every client.
func TestFailedTryReleasedAfterNodesWake(t *testing.T) {
	srvs := nodes(t, 3)
	cs := clientsWith(t, srvs, redis.Options{PoolSize: 1, ReadTimeout: 2 * time.Second, MaxRetries: -1})
	// The node timeout ends the try, and the release, well before the
	// read timeout frees the connection.
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const name, ttl = "wake", 5 * time.Second
	// warmUp waits for every node: Release returns at a majority, the
	// third node's delete may still be on its way, and found there the try
	// below would see the lock held.
	warmUp(t, l, srvs, name, ttl)
	stopped := srvs[1:]
	for _, s := range stopped {
		s.Signal(syscall.SIGSTOP)
		t.Cleanup(func() { s.Signal(syscall.SIGCONT) })
	}
	if _, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl)); !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Acquire with two of three nodes stopped = %v, want ErrNoQuorum", err)
	}
	woke := time.Now()
	for _, s := range stopped {
		s.Signal(syscall.SIGCONT)
	}
	deadline := woke.Add(ttl / 2)
	for {
		on := lockedOn(t, srvs, name)
		if len(on) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the nodes woke, the failed try still holds the lock on nodes %v", time.Since(woke), on)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	// And every node answers again.
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl), fence.Wait(2*time.Second))
	if err != nil {
		t.Fatalf("Acquire after the nodes woke: %v", err)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// waitUnlocked waits until name is locked on none of srvs, or fails.
func waitUnlocked(t testing.TB, srvs []*redistest.Server, name string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		on := lockedOn(t, srvs, name)
		if len(on) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v the lock is still held on nodes %v", within, on)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// The caller's context cancelled while the requests are out: Acquire
// returns the context's error, and what the nodes granted is given back
// (at once where their grants were read, as they come otherwise).
func TestCancelMidFanout(t *testing.T) {
	for _, n := range []int{3, 5} {
		srvs := nodes(t, n)
		l := newLocker(t, srvs, nil)
		const name = "cancelled"
		ctx, cancel := context.WithCancel(ctxFor(t))
		redlock.SetBeforeReplies(l, func() {
			// Let the nodes run the scripts, then cancel.
			deadline := time.Now().Add(5 * time.Second)
			for len(lockedOn(t, srvs, name)) < n && time.Now().Before(deadline) {
			}
			cancel()
		})
		_, err := l.Acquire(ctx, name, fence.TTL(10*time.Second))
		if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("%d nodes: Acquire cancelled mid-fan-out = %v, want ErrNotAcquired and context.Canceled", n, err)
		}
		// The nodes whose replies were not read by then are given back
		// in the background.
		waitUnlocked(t, srvs, name, 2*time.Second)
		redlock.SetBeforeReplies(l, nil)
		lease, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
		if err != nil {
			t.Fatalf("%d nodes: Acquire after the cancelled one: %v", n, err)
		}
		if err := lease.Release(ctxFor(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// Release while a watchdog renewal is waiting on a paused node: Release
// stops the renewal and succeeds (a majority deleted the lock), even when
// the lease's deadline passes while it waits for the paused node; nothing
// stays locked once the paused node has run what it was sent.
func TestReleaseDuringRenewal(t *testing.T) {
	srvs := nodes(t, 3)
	l, err := redlock.New(hangable(t, srvs), &redlock.Options{NodeTimeout: 2 * time.Second, WatchdogTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const name = "release-renewing"
	lease, err := l.Acquire(ctxFor(t), name)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	paused := srvs[2]
	before0, before2 := scriptCalls(t, srvs[0]), scriptCalls(t, paused)
	paused.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { paused.Signal(syscall.SIGCONT) })
	// The watchdog renews after a third of 3 s; the renewal has run on
	// node 0 and waits for node 2, for up to 2 s.
	waitScripts(t, srvs[0], before0+1)
	start := time.Now()
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release during a renewal: %v", err)
	}
	// It waits for the paused node up to the node timeout (2 s), not for
	// the renewal as well; it ends past the lease's deadline (the renewal
	// was cut short and moved it on a majority or not at all), which must
	// not turn a release into ErrLeaseLost.
	if took := time.Since(start); took > 2*time.Second+500*time.Millisecond {
		t.Errorf("Release during a renewal took %v", took)
	}
	// Err is ErrReleased, unless the renewal, cut short, had not moved
	// the deadline on a majority (on a loaded machine node 1's reply may
	// not have been read yet) and the deadline then passed while Release
	// waited: the expiry timer ended the lease first, at its deadline, as
	// it must. Release's nil above is what must not turn into ErrLeaseLost.
	if err := lease.Err(); !errors.Is(err, fence.ErrReleased) {
		if d := lease.Deadline(); !errors.Is(err, fence.ErrLeaseLost) || d.Before(start) || d.After(time.Now()) {
			t.Errorf("Err after Release = %v (deadline %v after Release began), want ErrReleased, or ErrLeaseLost at a deadline passed during Release", err, d.Sub(start))
		}
	}
	paused.Signal(syscall.SIGCONT)
	waitScripts(t, paused, before2+2) // the renewal and the release
	waitUnlocked(t, srvs, name, time.Second)
}

// A quorum lost while a watchdog lease is held (two of three nodes
// paused): the lease ends, Done closed, by its deadline.
func TestQuorumLostEndsLease(t *testing.T) {
	for _, how := range []string{"paused", "killed"} {
		srvs := nodes(t, 3)
		l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: time.Second, NodeTimeout: 300 * time.Millisecond})
		lease, err := l.Acquire(ctxFor(t), "quorum-lost")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		for _, s := range srvs[1:] {
			if how == "killed" {
				s.Kill()
			} else {
				s.Signal(syscall.SIGSTOP)
				t.Cleanup(func() { s.Signal(syscall.SIGCONT) })
			}
		}
		deadline := lease.Deadline()
		const slack = 500 * time.Millisecond // a loaded machine's timer latency
		select {
		case <-lease.Done():
		case <-time.After(time.Until(deadline) + slack):
			t.Fatalf("%s: the lease was not over %v after its deadline", how, slack)
		}
		// The watchdog may have moved the deadline before the nodes went;
		// the lease must end by the deadline it had when it ended.
		if late := time.Since(lease.Deadline()); late > slack {
			t.Errorf("%s: Done closed %v after the deadline", how, late)
		}
		if !errors.Is(lease.Err(), fence.ErrLeaseLost) || !errors.Is(context.Cause(lease.Context()), fence.ErrLeaseLost) {
			t.Errorf("%s: Err = %v, want ErrLeaseLost", how, lease.Err())
		}
		_ = lease.Release(ctxFor(t))
	}
}

// A Release that waits for a paused node past the lease's deadline still
// succeeds when a majority deleted the lock: the lease was not lost before
// Release was called. The clock that dates the acquisition is set back, so
// that the deadline falls while Release waits for the paused node.
func TestReleaseOutlivingDeadline(t *testing.T) {
	srvs := nodes(t, 3)
	l, err := redlock.New(hangable(t, srvs), &redlock.Options{NodeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	redlock.SetClock(l, func() time.Time { return time.Now().Add(-900 * time.Millisecond) })
	lease, err := l.Acquire(ctxFor(t), "release-late", fence.TTL(time.Second))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if lease.Err() != nil {
		t.Fatalf("the lease ended before Release: %v", lease.Err())
	}
	srvs[2].Signal(syscall.SIGSTOP)
	t.Cleanup(func() { srvs[2].Signal(syscall.SIGCONT) })
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release that outlived the deadline waiting for a paused node = %v, want nil", err)
	}
	if on := lockedOn(t, srvs[:2], "release-late"); len(on) != 0 {
		t.Fatalf("locked on %v after Release", on)
	}
}

// Three of five nodes paused during a try: it fails for want of a
// majority; the paused nodes run it when they wake, long after the try was
// given up on, and must not keep the lock: the revocation sent with the
// release (or its retries) makes the late try refuse, or deletes what it
// took. Ordinary clients (the deadline on the socket), and clients that
// leave it to their read timeout.
func TestLateNodesKeepNothing(t *testing.T) {
	for _, hang := range []bool{false, true} {
		srvs := nodes(t, 5)
		var cs []redis.UniversalClient
		if hang {
			cs = hangable(t, srvs)
		} else {
			cs = clients(t, srvs)
		}
		// Not about the timeout's length: the paused nodes miss any.
		l, err := redlock.New(cs, &redlock.Options{NodeTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		const name, ttl = "late-nodes", 10 * time.Second
		warm, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if err := warm.Release(ctxFor(t)); err != nil {
			t.Fatal(err)
		}
		waitUnlocked(t, srvs, name, 5*time.Second) // Release returns at a majority
		paused := []*redistest.Server{srvs[0], srvs[2], srvs[4]}
		before := make([]int, len(paused))
		for i, s := range paused {
			before[i] = scriptCalls(t, s)
			s.Signal(syscall.SIGSTOP)
			t.Cleanup(func() { s.Signal(syscall.SIGCONT) })
		}
		if _, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl)); !errors.Is(err, redlock.ErrNoQuorum) {
			t.Fatalf("Acquire with 3 of 5 nodes paused = %v, want ErrNoQuorum", err)
		}
		for i, s := range paused {
			s.Signal(syscall.SIGCONT)
			waitScripts(t, s, before[i]+2) // the try and its release
		}
		waitUnlocked(t, srvs, name, 2*time.Second)
	}
}

// A Release that cannot reach one node (paused, its only connection busy
// with a renewal) still succeeds on the majority; the node, when it wakes,
// must not keep the lock for the rest of its lease time: the release there
// is retried in the background.
func TestReleaseRetriedOnUnreachableNode(t *testing.T) {
	srvs := nodes(t, 3)
	cs := clientsWith(t, srvs, redis.Options{PoolSize: 1, ReadTimeout: 2 * time.Second, MaxRetries: -1})
	// The node timeout ends the renewal, and the release, well before the
	// read timeout frees the connection.
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const name, ttl = "release-unreachable", 10 * time.Second
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := lease.Extend(ctxFor(t), ttl); err != nil { // loads the extend script
		t.Fatalf("Extend: %v", err)
	}
	srvs[2].Signal(syscall.SIGSTOP)
	t.Cleanup(func() { srvs[2].Signal(syscall.SIGCONT) })
	// The renewal holds node 2's only connection for its read timeout.
	if err := lease.Extend(ctxFor(t), ttl); err != nil {
		t.Fatalf("Extend with one node paused: %v", err)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release with one node paused: %v", err)
	}
	woke := time.Now()
	srvs[2].Signal(syscall.SIGCONT)
	waitUnlocked(t, srvs, name, 2*time.Second)
	t.Logf("node 2 free %v after it woke", time.Since(woke))
}

// A node that ran the acquisition only after Acquire had given up waiting
// for it holds the lock for this lease; the watchdog's renewals, which
// know no deadline on that node's clock at first, must take it into the
// lease rather than ignore it or move it blindly: once it is renewed there,
// the lease survives losing one of the nodes that granted it in time.
func TestLateGrantJoinsLease(t *testing.T) {
	srvs := nodes(t, 3)
	l, err := redlock.New(hangable(t, srvs), &redlock.Options{NodeTimeout: 300 * time.Millisecond, WatchdogTTL: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const name = "late-grant"
	warm, err := l.Acquire(ctxFor(t), name, fence.TTL(time.Second))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := warm.Extend(ctxFor(t), time.Second); err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second) // Release returns at a majority
	late := srvs[2]
	before := scriptCalls(t, late)
	late.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { late.Signal(syscall.SIGCONT) })
	lease, err := l.Acquire(ctxFor(t), name)
	if err != nil {
		t.Fatalf("Acquire with node 2 paused: %v", err)
	}
	defer lease.Release(ctxFor(t))
	late.Signal(syscall.SIGCONT)
	// The late acquisition, then two renewals: the first reads node 2's
	// clock, the second moves the lock there.
	waitScripts(t, late, before+3)
	if on := lockedOn(t, srvs, name); len(on) != 3 {
		t.Fatalf("locked on %v, want all three nodes", on)
	}
	srvs[0].Kill()
	more := scriptCalls(t, late)
	waitScripts(t, late, more+3) // three renewals on nodes 1 and 2 alone
	if err := lease.Err(); err != nil {
		t.Fatalf("the lease ended with nodes 1 and 2 holding it: %v", err)
	}
	pttl, err := late.Client(t).PTTL(ctxFor(t), lockKey(name)).Result()
	if err != nil || pttl <= 0 {
		t.Fatalf("node 2's lock PTTL %v, %v", pttl, err)
	}
}
