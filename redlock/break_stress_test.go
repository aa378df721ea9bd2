package redlock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/stresstest"
	"github.com/fencekit/fence/redlock"
)

// Holders that Extend and Release at once, with contexts cancelled at
// random moments, on one lock over 3 nodes: never two holders at once,
// tokens increasing, every lease ended once its Release returned, and each
// end reported once, as Release's result says (see
// stresstest.RandomCancels).
func TestRandomCancelsNeverTwoHolders(t *testing.T) {
	srvs := nodes(t, 3)
	stresstest.RandomCancels(t, 3*time.Second, func(t *testing.T, obs fence.Observer) fence.Locker {
		return newLocker(t, srvs, &redlock.Options{WatchdogTTL: 300 * time.Millisecond, NodeTimeout: generous, Observer: obs})
	})
}
