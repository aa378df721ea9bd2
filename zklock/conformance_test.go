package zklock_test

import (
	"log/slog"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

func TestConformance(t *testing.T) { testConformance(t, false) }

// TestConformanceSessionTimeouts runs the suite with the Lockers taking the
// connection's SessionTimeouts (WithSessionTimeouts) rather than probing.
func TestConformanceSessionTimeouts(t *testing.T) { testConformance(t, true) }

func testConformance(t *testing.T, exact bool) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	admin := connect(t, addrs, nil)
	// newLC connects a session and returns a Locker on it, with opts,
	// and the connection.
	newLC := func(t testing.TB, opts ...zklock.Option) (fence.Locker, *zk.Conn) {
		logger, more := exactOpts(exact)
		conn, _, err := zk.Connect(addrs, sessionTimeout, zk.WithLogger(logger))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		waitFor(t, func() bool { return conn.State() == zk.StateHasSession })
		l, err := zklock.New(conn, sessionTimeout, append(opts, more...)...)
		if err != nil {
			t.Fatal(err)
		}
		return l, conn
	}
	newL := func(t testing.TB, opts ...zklock.Option) fence.Locker { l, _ := newLC(t, opts...); return l }
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New:               func(t testing.TB) fence.Locker { return newL(t) },
		// The holder's node is the lowest in the lock's directory.
		Remove: func(t testing.TB, name string) {
			nodes := lockNodes(t, admin, name)
			if len(nodes) == 0 {
				t.Fatalf("no node for %q", name)
			}
			if err := admin.Delete(nodes[0], -1); err != nil {
				t.Fatal(err)
			}
		},
		NewObserved: func(t testing.TB, obs fence.Observer) fence.Locker {
			return newL(t, zklock.WithObserver(obs))
		},
		NewLogged: func(t testing.TB, log *slog.Logger) fence.Locker {
			return newL(t, zklock.WithLogger(log))
		},
		// Closing the connection closes the session, which deletes the
		// lease's node before the Locker can tell that the connection
		// was closed: the lease ends as lost, its node deleted.
		ClosedLeaseLost: true,
		NewClosable: func(t testing.TB) (fence.Locker, func()) {
			l, conn := newLC(t)
			return l, conn.Close
		},
		WatchdogTTL:  sessionTimeout,
		SessionBound: sessionTimeout,
	})
}
