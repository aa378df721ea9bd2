package guard_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

func stores(t *testing.T) map[string]guard.Store {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = client.Close() })
	all := map[string]guard.Store{
		"memory": &guard.MemoryStore{},
		"redis":  guard.RedisStore{Client: client, Prefix: "guardtest:" + strconv.FormatInt(time.Now().UnixNano(), 36)},
	}
	for name, db := range databases(t) {
		if err := guard.CreateTables(ctx(t), db); err != nil {
			t.Fatal(err)
		}
		all["sql-"+name] = guard.SQLStore{DB: db}
	}
	return all
}

func TestMiddleware(t *testing.T) {
	for name, store := range stores(t) {
		t.Run(name, func(t *testing.T) {
			var served atomic.Int32
			srv := httptest.NewServer(guard.Middleware(store)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				served.Add(1)
				_, _ = io.WriteString(w, "approved")
			})))
			defer srv.Close()
			send := func(resource, token string) (int, guard.Problem) {
				req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL, nil)
				if resource != "" {
					req.Header.Set(guard.ResourceHeader, resource)
				}
				if token != "" {
					req.Header.Set(guard.TokenHeader, token)
				}
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var p guard.Problem
				if resp.StatusCode != http.StatusOK {
					if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
						t.Fatalf("Content-Type %q", ct)
					}
					if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
						t.Fatal(err)
					}
				}
				return resp.StatusCode, p
			}
			for _, tc := range []struct {
				resource, token string
				want            int
			}{
				{"payment:1001", "", http.StatusBadRequest},
				{"payment:1001", "abc", http.StatusBadRequest},
				{"payment:1001", "0", http.StatusBadRequest},
				{"payment:1001", "-5", http.StatusBadRequest},
				{"payment:1001", "+5", http.StatusBadRequest},
				{"payment:1001", "007", http.StatusBadRequest},
				{"payment:1001", "9223372036854775808", http.StatusBadRequest}, // int64 max + 1
				{"", "5", http.StatusBadRequest},
				{"pay{ment}", "5", http.StatusBadRequest},
				{"payment:1001", "5", http.StatusOK},
				{"payment:1001", "3", http.StatusConflict},
				{"payment:1001", "5", http.StatusConflict},
				{"payment:1002", "3", http.StatusOK}, // resources are independent
				{"payment:1001", "9223372036854775807", http.StatusOK},
				{"payment:1001", "9223372036854775806", http.StatusConflict},
			} {
				code, p := send(tc.resource, tc.token)
				if code != tc.want {
					t.Fatalf("%s token %q: %d %+v, want %d", tc.resource, tc.token, code, p, tc.want)
				}
				if code == http.StatusConflict && (p.Type != guard.ProblemStale || p.Last <= 0) {
					t.Fatalf("409 body %+v", p)
				}
			}
			if n := served.Load(); n != 3 {
				t.Fatalf("handler ran %d times, want 3 (only accepted requests)", n)
			}
		})
	}
}

func TestTransportAttachesLeaseToken(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer client.Close()
	locker, err := redislock.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	store := &guard.MemoryStore{}
	var seen atomic.Value
	srv := httptest.NewServer(guard.Middleware(store)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get(guard.ResourceHeader) + "=" + r.Header.Get(guard.TokenHeader))
	})))
	defer srv.Close()

	lease, err := locker.Acquire(ctx(t), "lock:transport", fence.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &guard.Transport{Base: srv.Client().Transport, Lease: lease, Resource: "payment:1001"}}
	resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("approve"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := "payment:1001=" + strconv.FormatInt(int64(lease.Token()), 10)
	if resp.StatusCode != http.StatusOK || seen.Load() != want {
		t.Fatalf("status %d, server saw %v, want %s", resp.StatusCode, seen.Load(), want)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	_, err = c.Post(srv.URL, "text/plain", strings.NewReader("approve"))
	if !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("request after Release: %v, want ErrReleased", err)
	}
}

func TestParseToken(t *testing.T) {
	good := map[string]fence.Token{"1": 1, "42": 42, "9223372036854775807": 1<<63 - 1}
	for s, want := range good {
		if got, err := guard.ParseToken(s); err != nil || got != want {
			t.Errorf("ParseToken(%q) = %d, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "0", "-1", "+1", "01", "1.5", "1e3", " 1", "9223372036854775808", "99999999999999999999"} {
		if _, err := guard.ParseToken(s); !errors.Is(err, guard.ErrInvalidToken) {
			t.Errorf("ParseToken(%q) = %v, want ErrInvalidToken", s, err)
		}
	}
}
