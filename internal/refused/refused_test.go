package refused

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestAddrRefusesAndKeepsThePort: a connection to Addr is refused, and a
// listener (Go's sets SO_REUSEADDR, as Redis's does) cannot take the port.
func TestAddrRefusesAndKeepsThePort(t *testing.T) {
	addr := Addr(t)
	_, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want connection refused", addr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		ln.Close()
		t.Fatalf("a listener took %s", addr)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("listen %s: %v, want address in use", addr, err)
	}
}
