package guard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/memlock"
)

// The server chooses the resource from the path; a request whose token is
// not greater than the last accepted one for that resource never reaches
// the handler. MemoryStore runs one resource's handlers one at a time, so
// the check and the handler's writes are ordered. (guard.SQLStore does the
// same with the handler inside the fenced transaction: see TxFrom.)
func ExampleMiddleware() {
	approved := map[string]string{}
	approve := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		approved[r.PathValue("id")] = r.Header.Get(guard.TokenHeader)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments/{id}/approve", guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{
		Resource: func(r *http.Request) (string, error) { return "payment:" + r.PathValue("id"), nil },
	})(approve))

	// Two leases on the payment's lock, one after the other: the first
	// holder comes back late, after the second has written.
	locker := &memlock.Locker{}
	ctx := context.Background()
	first, _ := locker.Acquire(ctx, "lock:payment:1001")
	_ = first.Release(ctx)
	second, _ := locker.Acquire(ctx, "lock:payment:1001")
	defer second.Release(ctx)

	for _, token := range []string{fmt.Sprint(int64(second.Token())), fmt.Sprint(int64(first.Token()))} {
		req := httptest.NewRequest(http.MethodPost, "/payments/1001/approve", nil)
		req.Header.Set(guard.TokenHeader, token)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code)
	}
	fmt.Println(len(approved))
	// Output:
	// 200
	// 409
	// 1
}
