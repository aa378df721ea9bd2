package pglock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// A database in an encoding other than UTF-8 (LATIN1 here, as old
// installations have), with a client that says it sends UTF-8
// (client_encoding=UTF8; pgx otherwise takes the database's encoding and
// its bytes are stored as LATIN1 characters, one per byte, which locks
// all the same), cannot store every valid lock name: a name with a
// character it has not is bad input, refused at once with an error
// matching fence.ErrInvalidName, not retried as a backend failure until
// the Wait budget ends. Names it can store work as before.
func TestNameTheDatabaseCannotStore(t *testing.T) {
	name := "t_latin1_" + time.Now().Format("150405000000")
	admin := open(t, pg.DSN("postgres"), nil)
	if _, err := admin.ExecContext(t.Context(), `CREATE DATABASE `+name+` ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.ExecContext(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`)
	})
	d := database{name: name, dsn: pg.DSN(name) + "&client_encoding=UTF8"}
	d.db = open(t, d.dsn, nil)
	l := d.locker(t, d.db)
	if err := l.EnsureSchema(t.Context()); err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "café", fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("a name LATIN1 can store: %v", err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, wait := range []time.Duration{3 * time.Second, 0} {
		start := time.Now()
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), "ключ 🔒", fence.TTL(time.Minute), fence.Wait(wait))
		if err == nil {
			_ = lease.Release(context.Background())
			t.Fatalf("Acquire of a name LATIN1 cannot store succeeded")
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("Acquire(wait %v) took %v to refuse a name the database cannot store: it retried a permanent error", wait, took)
		}
		if !errors.Is(err, fence.ErrInvalidName) || !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("Acquire(wait %v) of a name LATIN1 cannot store = %v, want ErrNotAcquired and ErrInvalidName", wait, err)
		}
		t.Logf("wait %v: %v", wait, err)
	}
}
