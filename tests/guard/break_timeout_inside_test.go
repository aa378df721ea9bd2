package guard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
)

// TestTimeoutHandlerInsideMiddleware: http.TimeoutHandler put inside
// Middleware (mw(http.TimeoutHandler(h, ...))) runs h on a goroutine of its
// own and answers 503 at the timeout while h goes on. Middleware then
// rolls back and lets the next request in: token 7 writes and commits,
// and only then does token 5's handler, still running, write. With
// SQLStore the late write (under a context that outlives the request's) goes
// through the fenced transaction that TxFrom gave it, rolled back by then:
// it fails (sql.ErrTxDone), and the
// state stays 7 (held). MemoryStore cannot stop a handler that writes
// elsewhere after it returned (Middleware's doc says so).
func TestTimeoutHandlerInsideMiddleware(t *testing.T) {
	for name, s := range stateStores(t) {
		if !s.sql {
			continue
		}
		t.Run(name, func(t *testing.T) {
			release, late := make(chan struct{}), make(chan error, 1)
			mw := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource})
			h := mw(http.TimeoutHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get(guard.TokenHeader) == "5" {
					<-release // a careless handler: it does not watch its context
					late <- s.write(r.WithContext(context.WithoutCancel(r.Context())), 5)
					return
				}
				if err := s.write(r, 7); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
			}), 2*time.Second, "timeout")) // generous: token 7's write must finish within it on a loaded machine
			srv := httptest.NewServer(h)
			defer srv.Close()
			defer close(release)
			if code, _, _ := send(t, srv.Client(), srv.URL, guard.TokenHeader, "5"); code != http.StatusServiceUnavailable {
				t.Fatalf("token 5 past its timeout: %d, want 503", code)
			}
			if code, _, body := send(t, srv.Client(), srv.URL, guard.TokenHeader, "7"); code != http.StatusOK {
				t.Fatalf("token 7: %d %s, want 200", code, body)
			}
			release <- struct{}{}
			select {
			case err := <-late:
				if err == nil {
					t.Errorf("token 5's handler wrote after its timeout, its transaction rolled back, and token 7's commit: no error")
				}
				t.Logf("token 5's late write: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("token 5's handler did not write within 10 s")
			}
			if v := s.read(t); v != 7 {
				t.Errorf("state %d after token 7's commit and token 5's late write; want 7", v)
			}
		})
	}
}
