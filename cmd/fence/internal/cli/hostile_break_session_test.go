package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"unicode"

	"github.com/fencekit/fence/internal/redistest"
)

// hostileRedis is a server (or whatever answers at a node's address: a
// compromised host, a proxy) that answers every RESP command with an error
// reply whose text holds terminal escapes. It returns its address.
func hostileRedis(t *testing.T, reply string) string {
	t.Helper()
	return serveTCP(t, func(c net.Conn, _ func(net.Conn), _ *sync.WaitGroup) {
		r := bufio.NewReader(c)
		for {
			// One command: *N, then N bulk strings ($len, data).
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			n := 0
			if strings.HasPrefix(line, "*") {
				for _, ch := range strings.TrimSpace(line[1:]) {
					n = n*10 + int(ch-'0')
				}
			}
			for range 2 * n {
				if _, err := r.ReadString('\n'); err != nil {
					return
				}
			}
			if _, err := c.Write([]byte("-ERR " + reply + "\r\n")); err != nil {
				return
			}
		}
	})
}

// TestRedlockStatusPrintsServerErrorEscaped: fence status --redlock prints
// each node's error, which is the node's own text (an error reply), and
// fence exec --redlock prints the Close's error. Neither may reach the
// terminal with its escapes as they are (termtext, as the doctor and
// errorLine do): status printed the node's error raw on stdout.
func TestRedlockStatusPrintsServerErrorEscaped(t *testing.T) {
	t.Parallel()
	a, b := redistest.Start(t), redistest.Start(t)
	evil := hostileRedis(t, "pwned\x1b]0;pwned\x07\x1b[2J\u009b31m")
	urls := redisURL(a) + "," + redisURL(b) + ",redis://" + evil
	out, errOut, code := fence(t, nil, "status", "--redlock", urls, "job")
	t.Logf("exit %d\nstdout:\n%q\nstderr:\n%q", code, out, errOut)
	if !strings.Contains(out+errOut, "pwned") {
		t.Fatalf("the node's error is not printed; the test shows nothing (exit %d)", code)
	}
	for name, s := range map[string]string{"stdout": out, "stderr": errOut} {
		for _, r := range s {
			if r != '\n' && r != ' ' && !unicode.IsPrint(r) {
				t.Errorf("%s carries %U as it is", name, r)
				break
			}
		}
	}
}

// TestRedlockStatusJSONCarriesNoControl: --json quotes a node's error in a
// JSON string; encoding/json escapes the C0 controls there but writes the
// C1 ones (U+009B is CSI to a terminal that takes C1 controls) and the
// format characters (U+202E reverses the text after it) as they are.
func TestRedlockStatusJSONCarriesNoControl(t *testing.T) {
	t.Parallel()
	a, b := redistest.Start(t), redistest.Start(t)
	evil := hostileRedis(t, "pwned\x1b]0;pwned\x07\u009b31m\u202eRLO")
	urls := redisURL(a) + "," + redisURL(b) + ",redis://" + evil
	out, errOut, code := fence(t, nil, "status", "--json", "--redlock", urls, "job")
	t.Logf("exit %d\nstdout:\n%q\nstderr:\n%q", code, out, errOut)
	if !strings.Contains(out, "pwned") {
		t.Fatalf("the node's error is not in the JSON; the test shows nothing (exit %d)", code)
	}
	for _, r := range out {
		if r != '\n' && r != ' ' && !unicode.IsPrint(r) {
			t.Errorf("stdout carries %U as it is", r)
		}
	}
	var v any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("stdout is not JSON: %v", err)
	}
	if !strings.Contains(fmt.Sprint(v), "\u009b31m\u202eRLO") {
		t.Errorf("the JSON does not decode to the node's text: %v", v)
	}
}
