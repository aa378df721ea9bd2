package pglock_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// An operator sets default_transaction_isolation to serializable (or
// repeatable read) on the database: two statements updating one row at
// once then fail with a serialization error (SQLSTATE 40001) where read
// committed would re-check the row. Try-once Acquires that race for a
// lock must still get it or ErrHeld, never a backend error, and the
// tokens still grow in grant order.
func TestSerializableDefaultIsolation(t *testing.T) {
	for _, level := range []string{"serializable", "repeatable read"} {
		t.Run(level, func(t *testing.T) {
			d := newDatabase(t, pg)
			if _, err := d.db.ExecContext(t.Context(), `ALTER DATABASE `+d.name+` SET default_transaction_isolation = '`+level+`'`); err != nil {
				t.Fatal(err)
			}
			var (
				mu     sync.Mutex
				tokens []fence.Token
				other  error
			)
			var wg sync.WaitGroup
			end := time.Now().Add(1500 * time.Millisecond)
			for range 4 {
				l := d.locker(t, open(t, d.dsn, nil))
				wg.Go(func() {
					for time.Now().Before(end) {
						lease, err := l.Acquire(ctxFor(t, 10*time.Second), "iso", fence.TTL(time.Minute))
						if errors.Is(err, fence.ErrHeld) {
							continue
						}
						if err != nil {
							mu.Lock()
							other = err
							mu.Unlock()
							return
						}
						mu.Lock()
						tokens = append(tokens, lease.Token())
						mu.Unlock()
						if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
							mu.Lock()
							other = err
							mu.Unlock()
							return
						}
					}
				})
			}
			wg.Wait()
			if other != nil {
				t.Fatalf("after %d grants: %v", len(tokens), other)
			}
			for i := 1; i < len(tokens); i++ {
				if tokens[i] <= tokens[i-1] {
					t.Fatalf("grant %d: token %d after %d", i, tokens[i], tokens[i-1])
				}
			}
			t.Logf("%d grants", len(tokens))

			// The first acquisitions of new names, at once: each creates
			// the name's row, and they race to.
			l := d.locker(t, d.db)
			errc := make(chan error, 4*50)
			for range 4 {
				wg.Go(func() {
					for i := range 50 {
						lease, err := l.Acquire(ctxFor(t, 10*time.Second), fmt.Sprint("new-", i), fence.TTL(time.Minute))
						if err == nil {
							err = lease.Release(ctxFor(t, 10*time.Second))
						}
						if err != nil && !errors.Is(err, fence.ErrHeld) {
							errc <- err
						}
					}
				})
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Fatalf("first acquisitions of new names: %v", err)
			}
		})
	}
}
