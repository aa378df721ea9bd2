package pglock_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// fence.Lead on pglock: when the leader's process dies (its pool closed,
// no more renewals), the other candidate leads within the watchdog TTL plus
// slack, with a greater token, and the dead leader's fn sees ErrLeaseLost.
func TestLeadOnPostgres(t *testing.T) {
	d := newDatabase(t, pg)
	type elected struct {
		who   string
		token fence.Token
		at    time.Time
	}
	var mu sync.Mutex
	var terms []elected
	causes := make(chan error, 4)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	dbs := map[string]*sql.DB{}
	for _, who := range []string{"a", "b"} {
		db := open(t, d.dsn, nil)
		dbs[who] = db
		l := d.locker(t, db)
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "leader", func(ctx context.Context, lease fence.Lease) error {
				mu.Lock()
				terms = append(terms, elected{who, lease.Token(), time.Now()})
				mu.Unlock()
				<-ctx.Done()
				causes <- context.Cause(ctx)
				return nil
			}, fence.Backoff(50*time.Millisecond, 500*time.Millisecond))
		})
	}
	waitTerms := func(n int, within time.Duration) []elected {
		t.Helper()
		for deadline := time.Now().Add(within); ; time.Sleep(5 * time.Millisecond) { // polling with a deadline
			mu.Lock()
			got := append([]elected(nil), terms...)
			mu.Unlock()
			if len(got) >= n {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d terms after %v, want %d", len(got), within, n)
			}
		}
	}
	first := waitTerms(1, 5*time.Second)[0]
	_ = dbs[first.who].Close() // the leader's process dies
	died := time.Now()
	second := waitTerms(2, watchdogTTL+time.Second)[1]
	t.Logf("%s led with token %d; %s leads with token %d %v after it died", first.who, first.token, second.who, second.token, second.at.Sub(died))
	if second.who == first.who || second.token <= first.token {
		t.Fatalf("second term %+v after %+v", second, first)
	}
	select {
	case cause := <-causes:
		if !errors.Is(cause, fence.ErrLeaseLost) {
			t.Fatalf("dead leader's fn saw %v, want ErrLeaseLost", cause)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the dead leader's fn was not stopped")
	}
}
