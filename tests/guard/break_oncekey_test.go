package guard_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fence/guard"
)

// TestOnceBadKey: an idempotency key that is empty, longer than 512 bytes,
// not UTF-8, or holds a NUL. Once refused the first two with an error no
// errors.Is could tell from a database failure; the last two reached the
// database, where PostgreSQL failed with its own encoding error (22021)
// and SQLite recorded them: one key, two behaviours. Each is now refused
// with ErrInvalidKey on both, before the database, and records nothing.
func TestOnceBadKey(t *testing.T) {
	bad := map[string]string{
		"empty":        "",
		"513 bytes":    strings.Repeat("k", 513),
		"not UTF-8":    "approve:\xff1001",
		"NUL":          "approve:\x001001",
		"cut rune":     "approve:1001\xe2\x82",
		"surrogate":    "approve:\xed\xa0\x80",
		"NUL at start": "\x00",
	}
	for name, db := range databases(t) {
		if err := guard.CreateTables(ctx(t), db); err != nil {
			t.Fatal(err)
		}
		for what, key := range bad {
			if err := guard.Once(ctx(t), db, key); !errors.Is(err, guard.ErrInvalidKey) {
				t.Errorf("%s: Once with a key %s (%q) = %v; want ErrInvalidKey", name, what, key, err)
			}
		}
		var n int
		if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM fence_idempotency`).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d keys recorded (%v); want none", name, n, err)
		}
		for _, key := range []string{"approve:1001", "k", strings.Repeat("é", 256), "zahlung:größe:1001"} {
			if err := guard.Once(ctx(t), db, key); err != nil {
				t.Errorf("%s: Once(%q) = %v; want nil", name, key, err)
			}
		}
	}
}
