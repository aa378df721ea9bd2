package memlock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/stresstest"
	"github.com/fencekit/fence/memlock"
)

// The backends' shared stress test (see stresstest.RandomCancels) on one
// memlock Locker: its Releases with contexts done at random moments used
// to leave leases held (Err nil after Release returned).
func TestRandomCancelsNeverTwoHolders(t *testing.T) {
	var (
		once sync.Once
		l    *memlock.Locker
	)
	stresstest.RandomCancels(t, 2*time.Second, func(t *testing.T, obs fence.Observer) fence.Locker {
		once.Do(func() { // one Locker, the "server" the holders share
			var err error
			if l, err = memlock.New(&memlock.Options{WatchdogTTL: 300 * time.Millisecond, Observer: obs}); err != nil {
				t.Fatal(err)
			}
		})
		return l
	})
}

// fence.Run's fn finds its context done once the lease's Done is closed,
// whether the lease ran out or its lock was removed (see
// stresstest.RunCtxDoneWithLease).
func TestRunCtxDoneWithLease(t *testing.T) {
	l, err := memlock.New(&memlock.Options{WatchdogTTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stresstest.RunCtxDoneWithLease(t, l, 100, func(_ testing.TB, name string) { l.Remove(name) })
}
