package cli_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// TestStatusRedlockUndecidedWithQuorumRead: five masters, quorum 3; the
// lock is held on two of the three read, and two do not answer. Those two
// may hold it too (2 + 2 >= 3), so whether a quorum holds it is unknown;
// fence status --redlock said "free on 2 of 5 nodes (quorum 3), 3 reached,
// 3 read" and exited 0, which a script reads as a free lock: its exit 2
// was keyed to fewer nodes read than a quorum, not to the nodes not read
// being able to make one. It exits 2 whenever they can, and says "held or
// free".
func TestStatusRedlockUndecidedWithQuorumRead(t *testing.T) {
	t.Parallel()
	a, b, c := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	var clients []redis.UniversalClient
	for _, s := range []*redistest.Server{a, b} {
		cl := redis.NewClient(&redis.Options{Addr: s.Addr})
		t.Cleanup(func() { cl.Close() })
		clients = append(clients, cl)
	}
	l, err := redlock.New(clients, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	if _, err := l.Acquire(context.Background(), "job"); err != nil {
		t.Fatal(err)
	}
	var closed []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closed = append(closed, "redis://"+ln.Addr().String())
		ln.Close() // nothing listens there: connections are refused
	}
	urls := strings.Join(append([]string{redisURL(a), redisURL(b), redisURL(c)}, closed...), ",")
	out, errOut, code := fence(t, nil, "status", "--redlock", urls, "job")
	t.Logf("status --redlock: exit %d\n%s%s", code, out, errOut)
	if !strings.Contains(out, "on 2 of 5 nodes (quorum 3)") || !strings.Contains(out, "3 read") {
		t.Fatalf("status --redlock: stdout %q; want the lock on 2 of 5 nodes, 3 read", out)
	}
	if code != 2 || strings.Contains(out, "job: free") {
		t.Errorf("status --redlock, held on 2 of 3 read, 2 not read: exit %d, stdout %q; want 2 (the nodes not read may make a quorum)", code, out)
	}
}
