package zklock_test

import (
	"log/slog"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/zklock"
)

func TestConformance(t *testing.T) {
	srv := startZK(t)
	addrs := []string{srv.Addr}
	admin := connect(t, addrs, nil)
	fencetest.Run(t, fencetest.Config{
		New: func(t testing.TB) fence.Locker {
			l, _ := newLocker(t, addrs)
			return l
		},
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
			l, err := zklock.New(connect(t, addrs, nil), sessionTimeout, zklock.WithObserver(obs))
			if err != nil {
				t.Fatal(err)
			}
			return l
		},
		NewLogged: func(t testing.TB, log *slog.Logger) fence.Locker {
			l, err := zklock.New(connect(t, addrs, nil), sessionTimeout, zklock.WithLogger(log))
			if err != nil {
				t.Fatal(err)
			}
			return l
		},
		WatchdogTTL:  sessionTimeout,
		SessionBound: sessionTimeout,
	})
}
