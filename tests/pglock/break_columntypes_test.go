package pglock_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
)

// TestLeaseTableOfWrongColumnTypes: a lease table written by hand in a
// migration (the README offers pglock.Schema "or" your own, and EnsureSchema
// afterwards creates nothing, only checks) with the right column names and
// the wrong types. EnsureSchema checked the names alone and returned nil:
//
//   - expires_at timestamp (without time zone, an ORM's default for a
//     time: Rails' t.datetime): each session writes and reads it in its own
//     TimeZone, so a Locker whose session is in UTC-5 reads a UTC holder's
//     row as expired five hours ago and takes it: two holders at once;
//   - expires_at timestamptz(0): the expiry is rounded to the second, up
//     to half a second before the holder's Deadline: another Locker can
//     take the row inside the lease;
//   - token integer (the tokens were 1, 2, 3 from the sequence before they
//     were floored by the clock in µs): every Acquire fails, with
//     ErrTokensExhausted, on a database that issued a handful of tokens.
//
// EnsureSchema must refuse each with an error matching
// fence.ErrInvalidOption, as it does a table without the lease columns.
// When it does not, the test shows the consequence.
func TestLeaseTableOfWrongColumnTypes(t *testing.T) {
	for _, c := range []struct{ name, token, expires string }{
		{"timestamp_without_time_zone", "bigint", "timestamp"},
		{"timestamptz_in_seconds", "bigint", "timestamptz(0)"},
		{"integer_token", "integer", "timestamptz"},
	} {
		t.Run(c.name, func(t *testing.T) {
			name, err := pg.CreateDatabase(t.Context(), t.Name())
			if err != nil {
				t.Fatal(err)
			}
			dsn := pg.DSN(name)
			utc := open(t, dsn+"&timezone=UTC", nil)
			if _, err := utc.ExecContext(t.Context(), `CREATE SEQUENCE fence_leases_token;
CREATE TABLE fence_leases (name text PRIMARY KEY, owner text NOT NULL, token `+c.token+` NOT NULL, expires_at `+c.expires+` NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			l, err := pglock.New(utc, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = l.EnsureSchema(t.Context())
			if errors.Is(err, fence.ErrInvalidOption) {
				t.Logf("EnsureSchema: %v", err)
				return
			}
			t.Errorf("EnsureSchema over a lease table with token %s, expires_at %s = %v, want ErrInvalidOption", c.token, c.expires, err)
			switch c.name {
			case "timestamp_without_time_zone":
				east, err := pglock.New(open(t, dsn+"&timezone=America/New_York", nil), nil)
				if err != nil {
					t.Fatal(err)
				}
				held, err := east.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				defer held.Release(ctxFor(t, 10*time.Second))
				if second, err := l.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(time.Minute)); err == nil {
					t.Errorf("two holders: token %d (session in America/New_York, Deadline in %v) and token %d (session in UTC)", held.Token(), time.Until(held.Deadline()).Round(time.Second), second.Token())
				}
			case "timestamptz_in_seconds":
				// Acquire until the expiry is rounded down.
				for i := range 20 {
					name := fmt.Sprint("x", i)
					held, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Second))
					if err != nil {
						t.Fatal(err)
					}
					var leftUs int64
					err = utc.QueryRowContext(t.Context(), `SELECT (extract(epoch FROM expires_at) * 1000000)::bigint FROM fence_leases WHERE name = $1`, name).Scan(&leftUs)
					_ = held.Release(ctxFor(t, 10*time.Second))
					if err != nil {
						t.Fatal(err)
					}
					if early := held.Deadline().Sub(time.UnixMicro(leftUs)); early > 0 {
						t.Errorf("the row (token %d) expires %v before the lease's Deadline: another Locker may take it inside the lease", held.Token(), early.Round(time.Millisecond))
						break
					}
				}
			case "integer_token":
				_, err := l.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(time.Minute))
				t.Errorf("Acquire on a fresh database: %v", err)
			}
		})
	}
}

// A hand-written lease table whose expires_at has an explicit precision
// of a millisecond or finer (Rails' t.timestamptz writes timestamptz(6))
// is fine: EnsureSchema accepts it and Acquire works.
func TestLeaseTableOfExplicitPrecisionAccepted(t *testing.T) {
	for _, expires := range []string{"timestamptz(6)", "timestamp(3) with time zone"} {
		t.Run(expires, func(t *testing.T) {
			db := pg.NewDB(t)
			if _, err := db.ExecContext(t.Context(), `CREATE SEQUENCE fence_leases_token;
CREATE TABLE fence_leases (name text PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL, expires_at `+expires+` NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			l, err := pglock.New(db, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.EnsureSchema(t.Context()); err != nil {
				t.Fatalf("EnsureSchema: %v", err)
			}
			lease, err := l.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
		})
	}
}
