package zklock_test

import (
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
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
		WatchdogTTL:  sessionTimeout,
		SessionBound: sessionTimeout,
	})
}
