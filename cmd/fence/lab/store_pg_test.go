package lab

import (
	"context"
	"errors"
	"testing"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
	"github.com/fencekit/fence/guard"
	"go.uber.org/goleak"
)

// The store tests' interleavings on the PostgreSQL row's database: one
// server (pgserver, as the lab starts it), a fresh database per case. The
// token-only update loses the stale holder's write, guard.Tx keeps both,
// and a stale write after the new holder's is rejected by guard.Tx and
// accepted with the comparison weakened.
func TestPostgresRow(t *testing.T) {
	// Registered first, so it runs last: after the server and every
	// database handle are closed.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	pg := &postgresServer{}
	if _, err := pg.start(); err != nil {
		t.Fatal(err) // names the install step when PostgreSQL is missing
	}
	t.Cleanup(pg.close)
	ctx := context.Background()
	resource := func(t *testing.T) *Resource {
		dsn, err := pg.database(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return testResourceAt(t, dsn)
	}
	t.Run("token-only loses the stale holder's write", func(t *testing.T) {
		r := resource(t)
		errA, errB := bothReadThenStaleWritesFirst(t, r, worker.WriteTokenOnly)
		if errA != nil || errB != nil {
			t.Fatalf("errors %v, %v; want both accepted", errA, errB)
		}
		if v := judgeLog(t, r, map[string]int64{"a": 1, "b": 2}); v.P3 != 1 || v.P1 != 0 {
			t.Fatalf("%+v, want P3 1 (a lost), P1 0", v)
		}
	})
	t.Run("guard.Tx keeps both writes", func(t *testing.T) {
		r := resource(t)
		errA, errB := bothReadThenStaleWritesFirst(t, r, worker.WriteGuard)
		if errA != nil || errB != nil {
			t.Fatalf("errors %v, %v; want both accepted", errA, errB)
		}
		if v := judgeLog(t, r, map[string]int64{"a": 1, "b": 2}); v.P1+v.P3 != 0 {
			t.Fatalf("%+v, want no violation", v)
		}
	})
	for _, mode := range []string{worker.WriteGuard, worker.WriteWeak} {
		t.Run("stale write after the new holder, "+mode, func(t *testing.T) {
			r := resource(t)
			if _, _, err := worker.Apply(ctx, r.db, mode, worker.Op{ID: "b", Worker: "b", Key: "p", Token: 2}, nil); err != nil {
				t.Fatal(err)
			}
			_, _, err := worker.Apply(ctx, r.db, mode, worker.Op{ID: "a", Worker: "a", Key: "p", Token: 1}, nil)
			ok := map[string]int64{"b": 2}
			if err == nil {
				ok["a"] = 1
			}
			v := judgeLog(t, r, ok)
			if mode == worker.WriteGuard && (!errors.Is(err, guard.ErrStale) || v.P1 != 0 || v.Rejected != 1) {
				t.Errorf("guard: err %v, %+v; want ErrStale, P1 0, one rejection logged", err, v)
			}
			if mode == worker.WriteWeak && (err != nil || v.P1 != 1) {
				t.Errorf("weakened: err %v, %+v; want accepted, P1 1", err, v)
			}
		})
	}
}
