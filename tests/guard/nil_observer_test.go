package guard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// nilObserver is an Observer given as a nil pointer: the nil
// *fenceprom.Observer of a fenceprom.New whose error was ignored is the
// same.
type nilObserver struct{ fence.NopObserver }

// TestNilObserverRefused: an Observer holding a nil pointer panicked at the
// first decision, after the store had accepted the token: behind
// Middleware the client got 503 for a write that was committed, and
// Table.Update panicked after its UPDATE, inside the caller's transaction.
// Middleware and Gate now panic at construction, as for their other
// invalid options, and Update returns ErrInvalidOption having run nothing.
func TestNilObserverRefused(t *testing.T) {
	var obs *nilObserver
	for name, build := range map[string]func(guard.HTTPOptions) func(http.Handler) http.Handler{
		"Middleware": func(o guard.HTTPOptions) func(http.Handler) http.Handler {
			return guard.Middleware(&guard.MemoryStore{}, o)
		},
		"Gate": func(o guard.HTTPOptions) func(http.Handler) http.Handler { return guard.Gate(redisStore(t), o) },
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "Observer") {
					t.Errorf("%s with a nil *nilObserver: recovered %v; want a panic naming Observer", name, r)
				}
			}()
			mw := build(guard.HTTPOptions{Resource: oneResource, Observer: obs})
			w, p := serveOnce(mw, func(http.ResponseWriter, *http.Request) {}, "5")
			t.Logf("%s built; a request got %d (panic %v)", name, w.Code, p)
		}()
	}
	for name, db := range databases(t) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, `CREATE TABLE payments (id BIGINT PRIMARY KEY, status TEXT, token BIGINT)`); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO payments (id, status) VALUES (1001, 'pending')`); err != nil {
			t.Fatal(err)
		}
		table := guard.Table{Name: "payments", Key: "id", Column: "token", Observer: obs}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: Update panicked: %v", name, r)
				}
			}()
			err := table.Update(ctx, db, 1001, 5, "status = $3", "approved")
			if !errors.Is(err, fence.ErrInvalidOption) {
				t.Errorf("%s: Update with a nil *nilObserver = %v; want ErrInvalidOption", name, err)
			}
		}()
		var status string
		if err := db.QueryRowContext(ctx, `SELECT status FROM payments WHERE id = 1001`).Scan(&status); err != nil || status != "pending" {
			t.Errorf("%s: status %q (%v) after the refused Update; want pending", name, status, err)
		}
	}
}
