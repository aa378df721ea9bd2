package guard_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
)

// A request whose context has ended by the time Middleware reads its body
// (a server-side timeout that another middleware set, say) is answered
// 400, and the connection's read deadline is moved to the past. When the
// whole body was already in the server's buffer, the connection itself is
// still good: the client may send its next request on it. That next
// request must not inherit the moved deadline: it must either find the
// connection closed or be served with a live context. (A read that fails
// on the moved deadline makes net/http cancel the connection's context, the
// parent of every later request's.)
func TestBodyEndedContextDoesNotPoisonKeepAlive(t *testing.T) {
	stores := map[string]guard.Store{"memory": &guard.MemoryStore{}}
	for name, s := range sqlStores(t) {
		stores["sql-"+name] = s.store
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			mw := guard.Middleware(store, guard.HTTPOptions{Resource: oneResource})
			mux := http.NewServeMux()
			mux.Handle("POST /ended", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, cancel := context.WithCancel(r.Context())
				cancel() // as a timeout middleware's deadline passed before Middleware ran
				mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
					t.Error("handler ran for a request whose context had ended")
				})).ServeHTTP(w, r.WithContext(c))
			}))
			mux.Handle("GET /check", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = fmt.Fprint(w, r.Context().Err())
			}))
			srv := httptest.NewServer(mux)
			defer srv.Close()

			for i := range 20 {
				conn, err := net.Dial("tcp", srv.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReader(conn)
				if _, err := fmt.Fprintf(conn, "POST /ended HTTP/1.1\r\nHost: x\r\n%s: %d\r\nContent-Length: 2\r\n\r\nab",
					guard.TokenHeader, i+1); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusBadRequest {
					t.Errorf("ended context: %d, want 400", resp.StatusCode)
				}
				if _, err := io.WriteString(conn, "GET /check HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
					continue // closed: fine
				}
				resp, err = http.ReadResponse(br, nil)
				if err != nil {
					continue // closed: fine
				}
				b, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if string(b) != "<nil>" {
					t.Fatalf("attempt %d: the next request on the kept-alive connection: %d, context %q; want a live context or a closed connection",
						i, resp.StatusCode, b)
				}
			}
		})
	}
}
