// Package silent gives tests a loopback address whose server accepts every
// connection and never answers (a wedged host, or a proxy in front of a dead
// one): a client's dial succeeds and its reads wait for its own timeouts.
// Beside package refused, whose address refuses every connection.
package silent

import (
	"net"
	"sync"
	"testing"
)

// Addr returns "127.0.0.1:port", accepting and silent until t's cleanup,
// which closes the listener and every connection it accepted (so that the
// clients' reads end).
func Addr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("silent: %v", err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}
