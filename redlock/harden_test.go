package redlock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
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
	redlock.SetClock(skewed, func() time.Time { return time.Now().Add(time.Hour) })
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
