package pglock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// The schema was created by a migration run as its owner; the application
// runs as a role that may use the table and the sequence but not create
// in the schema (PostgreSQL 15's default for public), and calls
// EnsureSchema at start-up, as the package doc suggests. With everything
// in place, EnsureSchema must succeed: CREATE ... IF NOT EXISTS checks the
// right to create before it finds the object, so it fails with
// "permission denied for schema public" when sent.
func TestEnsureSchemaWithoutCreateRight(t *testing.T) {
	d := newDatabase(t, pg)
	var version int
	if err := d.db.QueryRowContext(t.Context(), `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	dsn := roleDSN(t, d)
	if version < 150000 {
		// Before 15, every role may create in public: take it away.
		if _, err := d.db.ExecContext(t.Context(), `REVOKE CREATE ON SCHEMA public FROM PUBLIC`); err != nil {
			t.Fatal(err)
		}
	}
	l := d.locker(t, open(t, dsn, nil))
	if err := l.EnsureSchema(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("EnsureSchema with the schema in place, as a role that may not create: %v", err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "app", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(ctxFor(t, 10*time.Second))
}
