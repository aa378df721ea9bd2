package pglock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/pglock"
)

// TestUnloggedLeaseTableRefused: a lease table made UNLOGGED (by a
// migration written for speed, or ALTER TABLE ... SET UNLOGGED) is emptied
// by PostgreSQL's recovery after a crash: every lease held then is gone
// from the database while its holder's Deadline lies ahead, and another
// Locker takes the lock: two holders, whatever synchronous_commit says.
// EnsureSchema must refuse it with an error matching
// fence.ErrInvalidOption; when it does not, the test shows the
// consequence (the crash as in TestGrantSurvivesCrashUnderAsyncCommit: the
// WAL writer killed).
func TestUnloggedLeaseTableRefused(t *testing.T) {
	srv, err := pgtest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	d := newDatabase(t, srv) // the table made by EnsureSchema, then:
	if _, err := d.db.ExecContext(t.Context(), `ALTER TABLE fence_leases SET UNLOGGED`); err != nil {
		t.Fatal(err)
	}
	l := d.locker(t, d.db)
	err = l.EnsureSchema(t.Context())
	if errors.Is(err, fence.ErrInvalidOption) {
		t.Logf("EnsureSchema: %v", err)
		return
	}
	t.Errorf("EnsureSchema over an unlogged lease table = %v, want ErrInvalidOption", err)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.db.ExecContext(t.Context(), `ALTER DATABASE `+d.name+` SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	pgtest.CrashAfter(t, d.db, d.dsn, func() {})
	other, err := pglock.New(open(t, d.dsn, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if second, err := other.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(time.Minute)); err == nil {
		t.Errorf("two holders after a crash: the lease (token %d) has %v left, another Locker got token %d",
			lease.Token(), time.Until(lease.Deadline()).Round(time.Millisecond), second.Token())
	}
}
