package guard_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/fencekit/fence/guard"
)

// TestInvalidNamespacePanicsAtConstruction: an HTTPOptions.Namespace that
// no resource name can start with (a brace, a control character, longer
// than a name may be) made every request fail the resource check: each
// was answered 400 "could not tell which fenced resource", logged at
// Debug only, and the server ran without fencing anything, its
// misconfiguration invisible but to its clients. Middleware and Gate now
// panic at construction, as they do without a Resource.
func TestInvalidNamespacePanicsAtConstruction(t *testing.T) {
	for _, ns := range []string{"svc{1}:", "svc}", "svc\n", "svc\x7f:", strings.Repeat("n", 1024), "bad\xff:"} {
		for name, build := range map[string]func(guard.HTTPOptions) func(http.Handler) http.Handler{
			"Middleware": func(o guard.HTTPOptions) func(http.Handler) http.Handler {
				return guard.Middleware(&guard.MemoryStore{}, o)
			},
			"Gate": func(o guard.HTTPOptions) func(http.Handler) http.Handler { return guard.Gate(redisStore(t), o) },
		} {
			func() {
				defer func() {
					r := recover()
					if r == nil || !strings.Contains(fmt.Sprint(r), "Namespace") {
						t.Errorf("%s with Namespace %.20q: recovered %v; want a panic naming Namespace", name, ns, r)
					}
				}()
				mw := build(guard.HTTPOptions{Resource: oneResource, Namespace: ns})
				w, _ := serveOnce(mw, func(http.ResponseWriter, *http.Request) {}, "5")
				t.Logf("%s with Namespace %.20q built; a request got %d", name, ns, w.Code)
			}()
		}
	}
	// Valid namespaces still build.
	for _, ns := range []string{"", "http:", "svc/payments:", "zahlung:"} {
		guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: oneResource, Namespace: ns})
	}
}
