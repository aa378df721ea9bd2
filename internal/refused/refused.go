// Package refused gives tests a loopback address where every connection is
// refused, and stays refused for the whole test.
//
// A listener's address, closed, is free again at once: on a machine where
// other tests start servers on free ports, one of them may take it, and a
// test that meant "the server is down" talks to another test's Redis. A
// socket bound to the port without listen(2) refuses connections (the
// kernel answers them with a reset) and keeps the port: a server binds it
// only with SO_REUSEADDR on both sockets, and this one does not set it.
package refused

import (
	"fmt"
	"net"
	"syscall"
	"testing"
)

// Addr returns "127.0.0.1:port", refused until t's cleanup.
func Addr(t testing.TB) string {
	t.Helper()
	addr, closeFn, err := bind()
	if err != nil {
		t.Fatalf("refused: %v", err)
	}
	t.Cleanup(closeFn)
	return addr
}

func bind() (string, func(), error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("socket: %w", err)
	}
	closeFn := func() { _ = syscall.Close(fd) }
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		closeFn()
		return "", nil, fmt.Errorf("bind: %w", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		closeFn()
		return "", nil, fmt.Errorf("getsockname: %w", err)
	}
	in, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		closeFn()
		return "", nil, fmt.Errorf("getsockname: %T", sa)
	}
	return net.JoinHostPort("127.0.0.1", fmt.Sprint(in.Port)), closeFn, nil
}
