package guard_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// FuzzParseToken: no panic; a string is accepted iff it is the canonical
// decimal form of an int64 greater than zero, and parses back to itself.
func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"1", "42", "9223372036854775807", "9223372036854775808", "0", "-1", "+1", "01", " 1", "1e3", "", "٣"} {
		f.Add(s, int64(len(s)))
	}
	f.Fuzz(func(t *testing.T, s string, n int64) {
		tok, err := guard.ParseToken(s)
		v, perr := strconv.ParseInt(s, 10, 64)
		canonical := perr == nil && v > 0 && strconv.FormatInt(v, 10) == s
		switch {
		case canonical && (err != nil || int64(tok) != v):
			t.Fatalf("ParseToken(%q) = %d, %v; want %d", s, tok, err, v)
		case !canonical && err == nil:
			t.Fatalf("ParseToken(%q) = %d, want an error", s, tok)
		case err != nil && !errors.Is(err, guard.ErrInvalidToken):
			t.Fatalf("ParseToken(%q): %v does not match ErrInvalidToken", s, err)
		}
		if n > 0 {
			if tok, err := guard.ParseToken(strconv.FormatInt(n, 10)); err != nil || int64(tok) != n {
				t.Fatalf("round trip of %d: %d, %v", n, tok, err)
			}
		}
	})
}

// FuzzMiddlewareHeaders: whatever the Fence-Token and Fence-Resource
// headers hold, the middleware does not panic, runs the handler iff the
// token parses, is not past the clock plus an hour and the resource is not
// empty and valid once namespaced, and otherwise answers 400 with a short
// problem body.
func FuzzMiddlewareHeaders(f *testing.F) {
	f.Add("5", "payment:1001", false)
	f.Add("9223372036854775807", "payment:1001", false)
	f.Add("1800003600000001", "x", false)
	f.Add("7", "pay{ment}", true)
	f.Add("007", "", false)
	f.Fuzz(func(t *testing.T, token, resource string, twice bool) {
		mw := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: guard.ResourceFromHeader, Now: fixedClock})
		ran := false
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.Header[guard.TokenHeader] = []string{token}
		if twice {
			req.Header[guard.TokenHeader] = append(req.Header[guard.TokenHeader], token)
		}
		req.Header[guard.ResourceHeader] = []string{resource}
		w := httptest.NewRecorder()
		mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true })).ServeHTTP(w, req)

		tok, err := guard.ParseToken(token)
		want := !twice && err == nil && int64(tok) <= clock.UnixMicro()+3600e6 &&
			resource != "" && fence.ValidateName(guard.DefaultNamespace+resource) == nil
		if ran != want || (want && w.Code != http.StatusOK) {
			t.Fatalf("token %q resource %q twice %v: ran %v, status %d, want run %v", token, resource, twice, ran, w.Code, want)
		}
		if want {
			return
		}
		var p guard.Problem
		if w.Code != http.StatusBadRequest || json.Unmarshal(w.Body.Bytes(), &p) != nil || p.Status != w.Code {
			t.Fatalf("token %q resource %q: %d %q, want a 400 problem", token, resource, w.Code, w.Body)
		}
		if w.Body.Len() > 1024 {
			t.Fatalf("body of %d bytes", w.Body.Len())
		}
	})
}
