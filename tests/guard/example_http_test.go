package guard_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/fencekit/fence/guard"
)

// The handler runs inside the fenced transaction: its writes commit with the
// token, or not at all. The server chooses the resource from the path.
func ExampleMiddleware() {
	ctx := context.Background()
	db, _ := sql.Open("sqlite", "file:examplehttp?mode=memory")
	defer db.Close()
	db.SetMaxOpenConns(1) // one in-memory database
	_ = guard.CreateTables(ctx, db)
	_, _ = db.ExecContext(ctx, `CREATE TABLE payment (id TEXT PRIMARY KEY, status TEXT)`)
	_, _ = db.ExecContext(ctx, `INSERT INTO payment VALUES ('1001', 'PENDING')`)

	approve := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := guard.TxFrom(r.Context())
		_, err := tx.ExecContext(r.Context(), `UPDATE payment SET status = 'APPROVED' WHERE id = $1`, r.PathValue("id"))
		if err != nil {
			http.Error(w, "cannot approve", http.StatusInternalServerError) // rolls back
		}
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments/{id}/approve", guard.Middleware(guard.SQLStore{DB: db}, guard.HTTPOptions{
		Resource: func(r *http.Request) (string, error) { return "payment:" + r.PathValue("id"), nil },
	})(approve))

	for _, token := range []string{"2", "1"} {
		req := httptest.NewRequest(http.MethodPost, "/payments/1001/approve", nil)
		req.Header.Set(guard.TokenHeader, token)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println("token", token, "->", w.Code)
	}
	var resource string
	_ = db.QueryRowContext(ctx, `SELECT resource FROM fence_tokens`).Scan(&resource)
	fmt.Println(resource)
	// Output:
	// token 2 -> 200
	// token 1 -> 409
	// http:payment:1001
}
