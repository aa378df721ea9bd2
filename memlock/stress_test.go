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
