package pglock_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/pgtest"
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
	second := waitTerms(2, watchdogTTL+4*time.Second)[1] // slack for a loaded machine
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

// fence.Lead on pglock across a restart of PostgreSQL (every connection,
// the Listeners' among them, killed): three candidates; the leader's
// renewals fail while the server is down, which it stays until the term
// has ended by its deadline; after the restart a leader is elected again within a few
// seconds, with a greater token, after every earlier term ended.
func TestLeadAcrossServerRestart(t *testing.T) {
	srv, err := pgtest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	d := newDatabase(t, srv)
	if _, err := d.db.ExecContext(t.Context(), `ALTER DATABASE `+d.name+` SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	type elected struct {
		who        string
		token      fence.Token
		start, end time.Time
	}
	var mu sync.Mutex
	var terms []*elected
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for _, who := range []string{"a", "b", "c"} {
		l := d.locker(t, open(t, d.dsn, nil))
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "leader", func(ctx context.Context, lease fence.Lease) error {
				tm := &elected{who: who, token: lease.Token(), start: time.Now()}
				mu.Lock()
				terms = append(terms, tm)
				mu.Unlock()
				<-ctx.Done()
				mu.Lock()
				tm.end = time.Now()
				mu.Unlock()
				return nil
			}, fence.Backoff(20*time.Millisecond, 200*time.Millisecond), fence.LeaseOptions(fence.Wait(5*time.Second)))
		})
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(terms) }
	waitCount := func(n int, within time.Duration) bool {
		for deadline := time.Now().Add(within); count() < n; time.Sleep(5 * time.Millisecond) { // polling with a deadline
			if time.Now().After(deadline) {
				return false
			}
		}
		return true
	}
	if !waitCount(1, 10*time.Second) {
		t.Fatal("no leader within 10 s")
	}
	ended := func() bool { mu.Lock(); defer mu.Unlock(); return !terms[len(terms)-1].end.IsZero() }
	for round := 1; round <= 2; round++ {
		n := count()
		// The server stays down until the leader's term has ended: a
		// restart shorter than the lease's time left keeps the leader (its
		// renewal after the restart succeeds; TestWatchdogLeaseAcrossRestart),
		// and then no new term follows.
		var endedDown bool
		err := srv.RestartAfter(func() {
			for deadline := time.Now().Add(5 * time.Second); !endedDown && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) { // polling with a deadline
				endedDown = ended()
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if !endedDown {
			t.Fatalf("round %d: the leader's term did not end within 5 s of the server's stop", round)
		}
		restarted := time.Now()
		if !waitCount(n+1, 15*time.Second) {
			t.Fatalf("round %d: no new term within 15 s of the restart", round)
		}
		t.Logf("round %d: a new term %v after the restart", round, time.Since(restarted))
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(terms); i++ {
		p, c := terms[i-1], terms[i]
		if c.token <= p.token || c.start.Before(p.end) {
			t.Errorf("term %d (%s, token %d, from %v) after term %d (%s, token %d, until %v)", i, c.who, c.token, c.start.Format(time.StampMicro), i-1, p.who, p.token, p.end.Format(time.StampMicro))
		}
	}
}
