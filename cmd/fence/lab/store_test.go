package lab

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
	"github.com/fencekit/fence/guard"
)

// These tests drive the resource's write modes through fixed interleavings
// with the hook between read and write, without Redis, and judge the
// database's own log with Check.

func testResource(t *testing.T) *Resource {
	t.Helper()
	return testResourceAt(t, filepath.Join(t.TempDir(), "r.db"))
}

// testResourceAt opens the resource at path: a SQLite file, or a
// PostgreSQL connection string.
func testResourceAt(t *testing.T, path string) *Resource {
	t.Helper()
	ctx := context.Background()
	db, err := worker.OpenDB(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := worker.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := worker.EnsureRow(ctx, db, "p"); err != nil {
		t.Fatal(err)
	}
	return &Resource{path: path, db: db}
}

// judgeLog runs Check on the resource's log and state, with a history in which
// ops were acknowledged as ok says.
func judgeLog(t *testing.T, r *Resource, ok map[string]int64) Verdict {
	t.Helper()
	log, err := r.Log()
	if err != nil {
		t.Fatal(err)
	}
	state, err := r.State()
	if err != nil {
		t.Fatal(err)
	}
	var evs []Event
	for op, token := range ok {
		evs = append(evs,
			Event{Worker: op, Op: op, Key: "p", Kind: "write", Phase: "invoke", Token: token},
			Event{Worker: op, Op: op, Key: "p", Kind: "write", Phase: "ok", Token: token})
	}
	return Check(evs, log, state)
}

// bothReadThenStaleWritesFirst: A (token 1) and B (token 2) both read; A
// writes; then B writes. It returns the two errors.
func bothReadThenStaleWritesFirst(t *testing.T, r *Resource, mode string) (errA, errB error) {
	ctx := context.Background()
	aRead, bRead, aDone, bDone := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(bDone)
		<-aRead
		_, _, errB = worker.Apply(ctx, r.db, mode, worker.Op{ID: "b", Worker: "b", Key: "p", Token: 2}, func([]string) {
			close(bRead)
			<-aDone
		})
	}()
	_, _, errA = worker.Apply(ctx, r.db, mode, worker.Op{ID: "a", Worker: "a", Key: "p", Token: 1}, func([]string) {
		close(aRead)
		if mode == worker.WriteTokenOnly {
			<-bRead // outside any transaction B can read now
		}
	})
	close(aDone)
	<-bDone
	return errA, errB
}

// The payment example's hazard: with the read outside the transaction and
// the token-only update, both writes are accepted and A's is lost: P3 sees
// it, P1 does not.
func TestTokenOnlyLosesTheStaleHoldersWrite(t *testing.T) {
	r := testResource(t)
	errA, errB := bothReadThenStaleWritesFirst(t, r, worker.WriteTokenOnly)
	if errA != nil || errB != nil {
		t.Fatalf("token-only: errors %v, %v; want both accepted", errA, errB)
	}
	v := judgeLog(t, r, map[string]int64{"a": 1, "b": 2})
	if v.P3 != 1 || v.P1 != 0 {
		t.Fatalf("token-only: %+v, want P3 1 (a lost), P1 0", v)
	}
}

// The same interleaving through guard.Tx: B's transaction waits for A's, then
// reads A's write. Nothing is lost.
func TestGuardTxKeepsBothWrites(t *testing.T) {
	r := testResource(t)
	errA, errB := bothReadThenStaleWritesFirst(t, r, worker.WriteGuard)
	if errA != nil || errB != nil {
		t.Fatalf("guard: errors %v, %v; want both accepted", errA, errB)
	}
	if v := judgeLog(t, r, map[string]int64{"a": 1, "b": 2}); v.P1+v.P3 != 0 {
		t.Fatalf("guard: %+v, want no violation", v)
	}
}

// A stale holder that writes after the new one: guard.Tx rejects it (and
// the log records the rejection); with the comparison weakened it is
// accepted and P1 sees it.
func TestStaleWriteAfterTheNewHolder(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []string{worker.WriteGuard, worker.WriteWeak} {
		r := testResource(t)
		if _, _, err := worker.Apply(ctx, r.db, mode, worker.Op{ID: "b", Worker: "b", Key: "p", Token: 2}, nil); err != nil {
			t.Fatal(err)
		}
		_, _, err := worker.Apply(ctx, r.db, mode, worker.Op{ID: "a", Worker: "a", Key: "p", Token: 1}, nil)
		ok := map[string]int64{"b": 2}
		if err == nil {
			ok["a"] = 1
		}
		v := judgeLog(t, r, ok)
		switch mode {
		case worker.WriteGuard:
			if !errors.Is(err, guard.ErrStale) || v.P1 != 0 || v.Rejected != 1 {
				t.Errorf("guard: err %v, %+v; want ErrStale, P1 0, one rejection logged", err, v)
			}
		case worker.WriteWeak:
			if err != nil || v.P1 != 1 {
				t.Errorf("weakened: err %v, %+v; want accepted, P1 1", err, v)
			}
		}
	}
}
