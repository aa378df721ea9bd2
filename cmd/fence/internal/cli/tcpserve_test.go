package cli_test

import (
	"net"
	"sync"
	"testing"
)

// serveTCP listens on a free loopback port and runs handle for each
// connection accepted, in a goroutine of its own; handle may start more
// with wg.Go, and pass track the connections it opens (a proxy's to its
// target). t.Cleanup closes the listener and every connection, and waits
// for the goroutines. It returns the address.
func serveTCP(t *testing.T, handle func(c net.Conn, track func(net.Conn), wg *sync.WaitGroup)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Go(func() { handle(c, track, &wg) })
		}
	})
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
