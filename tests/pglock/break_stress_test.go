package pglock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/stresstest"
	"github.com/fencekit/fence/pglock"
)

// Holders that Extend and Release at once, with contexts cancelled at
// random moments, on one lock: never two holders at once, tokens
// increasing, every lease ended once its Release returned, and each end
// reported once, as Release's result says (see stresstest.RandomCancels).
// It found a Release that freed the row before it ended the lease
// (f3ffdfb: "token 14 granted while token 13 is held").
func TestRandomCancelsNeverTwoHolders(t *testing.T) {
	d := newDatabase(t, pg)
	stresstest.RandomCancels(t, 3*time.Second, func(t *testing.T, obs fence.Observer) fence.Locker {
		return d.lockerWith(t, d.db, pglock.Options{Observer: obs})
	})
}
