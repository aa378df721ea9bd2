package pglock_test

import (
	"database/sql"
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

// Two fence.Lead candidates whose ctx is cancelled at random moments, in
// rounds (see stresstest.LeadCancels): each Lead returns promptly, terms
// never overlap, tokens grow, and the lock is free once both returned (the
// lease time being 30 s, a row a cancelled campaign left would show).
func TestLeadCancelledAtRandom(t *testing.T) {
	d := newDatabase(t, pg)
	var ls []fence.Locker
	for _, db := range []*sql.DB{d.db, open(t, d.dsn, nil)} {
		l, err := pglock.New(db, &pglock.Options{WatchdogTTL: 30 * time.Second, Listener: pgxListener{d.dsn}})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	stresstest.LeadCancels(t, 40, ls[0], ls[1], 2*time.Second, 5*time.Second)
}

// fence.Run's fn finds its context done once the lease's Done is closed,
// whether the lease ran out or its row was deleted (see
// stresstest.RunCtxDoneWithLease).
func TestRunCtxDoneWithLease(t *testing.T) {
	d := newDatabase(t, pg)
	stresstest.RunCtxDoneWithLease(t, d.locker(t, d.db), 50, d.remove)
}
