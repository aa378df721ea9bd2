package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// TestNilDatabaseIsAnError: guard's SQL calls given no database (a nil
// *sql.DB, a nil Querier, a SQLStore whose DB was left out) or Tx given no
// fn return an error matching fence.ErrInvalidOption, as fence.Run does for
// a nil fn, rather than panic; Middleware over such a SQLStore answers 503
// (the store failed) instead of a handler panic that net/http turns into a
// dropped connection. Before, every one of them panicked with a nil pointer
// dereference.
func TestNilDatabaseIsAnError(t *testing.T) {
	ctx := context.Background()
	var nilDB *sql.DB
	var nilTx *sql.Tx
	table := guard.Table{Name: "payment", Key: "id", Column: "last_fencing_token"}
	noop := func(*sql.Tx) error { return nil }
	for what, call := range map[string]func() error{
		"Tx nil db":               func() error { return guard.Tx(ctx, nil, "payment:1001", 5, noop) },
		"Tx nil fn":               func() error { return guard.Tx(ctx, new(sql.DB), "payment:1001", 5, nil) },
		"Fence nil":               func() error { return guard.Fence(ctx, nil, "payment:1001", 5) },
		"Fence nil *sql.Tx":       func() error { return guard.Fence(ctx, nilTx, "payment:1001", 5) },
		"Once nil *sql.DB":        func() error { return guard.Once(ctx, nilDB, "approve:1001") },
		"Update nil":              func() error { return table.Update(ctx, nil, 1001, 5, "status = $3", "APPROVED") },
		"UpdateVersion nil":       func() error { return table.UpdateVersion(ctx, nil, 1001, 0, "status = $3", "APPROVED") },
		"CreateTables nil":        func() error { return guard.CreateTables(ctx, nil) },
		"CreateIfNotExists nil":   func() error { return guard.CreateIfNotExists(ctx, nilDB, "CREATE TABLE x (a int)") },
		"SQLStore without DB .Do": func() error { return guard.SQLStore{}.Do(ctx, "r", 5, func(context.Context) error { return nil }) },
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: panicked: %v", what, r)
				}
			}()
			if err := call(); !errors.Is(err, fence.ErrInvalidOption) {
				t.Errorf("%s = %v; want an error matching fence.ErrInvalidOption", what, err)
			}
		}()
	}

	ran := false
	mw := guard.Middleware(guard.SQLStore{}, guard.HTTPOptions{
		Resource: func(*http.Request) (string, error) { return "payment:1001", nil },
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true })))
	defer srv.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
	req.Header.Set(guard.TokenHeader, "5")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("Middleware over a SQLStore without DB: %v (the handler panicked and the connection was dropped?)", err)
	}
	resp.Body.Close()
	if resp.StatusCode < 500 || ran {
		t.Fatalf("Middleware over a SQLStore without DB: %d, handler ran %v; want a 5xx (the store failed) and not run", resp.StatusCode, ran)
	}
}
