package pglock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
)

// ciCollation creates a case-insensitive ICU collation (nondeterministic,
// as PostgreSQL requires for one that calls "x" and "X" equal).
const ciCollation = `CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);`

// TestLeaseTableOfWrongNameOrOwnerTypes: a lease table written by hand
// (the README offers pglock.Schema "or" your own migration) with token and
// expires_at right, and name or owner of another type than text.
// EnsureSchema checked only token and expires_at, and returned nil:
//
//   - name varchar(10): a name of 11 characters whose last is a space is
//     stored cut to 10 (PostgreSQL cuts trailing spaces to fit rather than
//     fail), and the row never matches the name again: Acquire of that
//     free name created its row, found none, created it again, ... until
//     its ctx ended (2 s here; for ever with none);
//   - name char(20): padded with spaces, and compared without them: "x "
//     was held as long as "x" was, two locks one;
//   - name of type name: cut to 63 bytes, so that two names of 80 bytes
//     with one prefix were one lock;
//   - name citext, or text with a case-insensitive collation: "X" was held
//     as long as "x" was;
//   - owner varchar(16), too short for the 32 hex digits of an owner, and
//     owner uuid, which cannot hold the free row's empty owner: every
//     Acquire failed.
//
// fence compares names as bytes (fence.ValidateName). EnsureSchema must
// refuse each with an error matching fence.ErrInvalidOption that names
// the column; when it does not, the test shows the consequence.
func TestLeaseTableOfWrongNameOrOwnerTypes(t *testing.T) {
	long := strings.Repeat("0123456789", 8)
	for _, c := range []struct {
		name, nameType, ownerType, setup string
		column                           string // the column EnsureSchema must name
		held, other                      string // a name held, and another that must be free
	}{
		{name: "varchar_name", nameType: "varchar(10)", ownerType: "text", column: "name", other: "0123456789 "},
		{name: "char_name", nameType: "char(20)", ownerType: "text", column: "name", held: "x", other: "x "},
		{name: "name_name", nameType: "name", ownerType: "text", column: "name", held: long + "-a", other: long + "-b"},
		{name: "citext_name", nameType: "citext", ownerType: "text", setup: "CREATE EXTENSION citext;", column: "name", held: "x", other: "X"},
		{name: "case_insensitive_name", nameType: "text COLLATE ci", ownerType: "text", setup: ciCollation, column: "name", held: "x", other: "X"},
		{name: "short_owner", nameType: "text", ownerType: "varchar(16)", column: "owner", other: "x"},
		{name: "uuid_owner", nameType: "text", ownerType: "uuid", column: "owner", other: "x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := pg.NewDB(t)
			if _, err := db.ExecContext(t.Context(), c.setup+`CREATE SEQUENCE fence_leases_token;
CREATE TABLE fence_leases (name `+c.nameType+` PRIMARY KEY, owner `+c.ownerType+` NOT NULL, token bigint NOT NULL, expires_at timestamptz NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			l, err := pglock.New(db, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = l.EnsureSchema(t.Context())
			if errors.Is(err, fence.ErrInvalidOption) && strings.Contains(err.Error(), c.column+" is ") {
				t.Logf("EnsureSchema: %v", err)
				return
			}
			t.Errorf("EnsureSchema over a lease table with name %s, owner %s = %v, want ErrInvalidOption naming %s", c.nameType, c.ownerType, err, c.column)
			if c.held != "" {
				held, err := l.Acquire(ctxFor(t, 10*time.Second), c.held, fence.TTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = held.Release(ctxFor(t, 10*time.Second)) }()
			}
			start := time.Now()
			lease, err := l.Acquire(ctxFor(t, 2*time.Second), c.other, fence.TTL(time.Minute))
			if err == nil {
				_ = lease.Release(ctxFor(t, 10*time.Second))
				return
			}
			if c.held != "" {
				t.Errorf("Acquire(%q) with only %q held = %v", c.other, c.held, err)
			} else {
				t.Errorf("Acquire(%q) of a free lock = %v after %v", c.other, err, time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

// A hand-written lease table whose name and owner are of other types than
// text that hold every name and owner as given is fine: EnsureSchema
// accepts it and Acquire works (a name is at most fence.MaxNameLen bytes,
// so at most as many characters; an owner is 32 hex digits).
func TestLeaseTableOfOtherNameOrOwnerTypesAccepted(t *testing.T) {
	for _, c := range []struct{ nameType, ownerType string }{
		{"varchar(256)", "varchar(32)"},
		{"varchar", "char(40)"},
		{`text COLLATE "C"`, "character varying"},
	} {
		t.Run(c.nameType+"/"+c.ownerType, func(t *testing.T) {
			db := pg.NewDB(t)
			if _, err := db.ExecContext(t.Context(), `CREATE SEQUENCE fence_leases_token;
CREATE TABLE fence_leases (name `+c.nameType+` PRIMARY KEY, owner `+c.ownerType+` NOT NULL, token bigint NOT NULL, expires_at timestamptz NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			l, err := pglock.New(db, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.EnsureSchema(t.Context()); err != nil {
				t.Fatalf("EnsureSchema: %v", err)
			}
			for _, name := range []string{"x", "x ", "X", strings.Repeat("é", fence.MaxNameLen/2)} {
				lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
				if err != nil {
					t.Fatalf("Acquire(%q): %v", name, err)
				}
				defer func() {
					if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
						t.Errorf("Release(%q): %v", name, err)
					}
				}()
			}
		})
	}
}
