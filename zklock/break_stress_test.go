package zklock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/stresstest"
	"github.com/fencekit/fence/zklock"
)

// Holders that Extend and Release at once, with contexts cancelled at
// random moments, on one lock: never two holders at once, tokens
// increasing, every lease ended once its Release returned, and each end
// reported once, as Release's result says (see stresstest.RandomCancels).
func TestRandomCancelsNeverTwoHolders(t *testing.T) {
	srv := startZK(t)
	addrs := []string{srv.Addr}
	stresstest.RandomCancels(t, 3*time.Second, func(t *testing.T, obs fence.Observer) fence.Locker {
		l, err := zklock.New(connect(t, addrs, nil), sessionTimeout, zklock.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}
