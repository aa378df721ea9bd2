package cli_test

import (
	"bufio"
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
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
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
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
