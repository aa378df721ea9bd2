package redlock_test

import (
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
	// A sane client's floor is below the cap: every node answers it, and
	// every node's record holds the lease's token.
	for i, s := range srvs {
		rec, err := s.Client(t).Get(ctxFor(t), lockKey(name)+":token").Int64()
		if err != nil || fence.Token(rec) != b.Token() {
			t.Fatalf("node %d's record %d, %v; want %d", i, rec, err, b.Token())
		}
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
	l, err := redlock.New(hangable(t, srvs), &redlock.Options{NodeTimeout: 50 * time.Millisecond})
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
	cs := make([]redis.UniversalClient, len(srvs))
	for i, s := range srvs {
		c := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 1, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const name, ttl = "wake", 5 * time.Second
	warm, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
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
