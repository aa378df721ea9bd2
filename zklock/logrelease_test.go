package zklock_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// A Logger's handler releases the lease when the monitor logs that a check
// of the lease's node failed: that Release must not wait for the monitor,
// which is inside the handler. The check is made to fail with the session
// alive: an admin changes the node's data and then takes READ off its ACL,
// which fires the monitor's watch, so that its next check (a GetW, to set
// the watch again) is refused. Before the fix the handler's Release waited
// for the monitor for ever.
func TestLoggerReleasesOnCheckFailed(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	admin := connect(t, addrs, nil)
	h := observetest.NewReleaser("check of the lease's node failed")
	l, err := zklock.New(connect(t, addrs, nil), sessionTimeout, zklock.WithLogger(slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	const name = "log-release"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	h.Set(lease)
	nodes := lockNodes(t, admin, name)
	if len(nodes) == 0 {
		t.Fatalf("no node for %q", name)
	}
	// The data change fires the watch (ZooKeeper does not deliver it to a
	// client without READ, so READ goes after it); the monitor's next check
	// is a GetW, refused. Should that check come between the two, it sets
	// the watch again: try again.
	var got error
	for try := 0; ; try++ {
		if _, err := admin.SetACL(nodes[0], zk.WorldACL(zk.PermAll), -1); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Set(nodes[0], []byte("x"), -1); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.SetACL(nodes[0], zk.WorldACL(zk.PermAll&^zk.PermRead), -1); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(3 * time.Second)
		for !h.Called() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // polling with a deadline
		}
		if h.Called() || try == 3 {
			got = h.Await(t, 10*time.Second)
			break
		}
	}
	err = got
	t.Logf("Release from the handler: %v", err)
	if lease.Err() == nil {
		t.Fatal("the lease is held after Release from the handler")
	}
}
