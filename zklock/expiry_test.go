package zklock_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// session records the session id and password from the connect replies a
// client reads, so that a test can close that session from another
// connection, as an operator's tool or a server deciding it expired would.
type session struct {
	mu     sync.Mutex
	id     int64
	passwd []byte
}

// dial is a zk.Dialer that records the session of each connection.
func (s *session) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &sniffer{Conn: c, s: s}, nil
}

// sniffer reads the connect reply that opens each connection.
type sniffer struct {
	net.Conn
	s    *session
	head []byte
	done bool
}

func (c *sniffer) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done {
		c.head = append(c.head, p[:n]...)
		// length, protocol version, timeout, session id, password length
		if len(c.head) >= 24 {
			size := int(binary.BigEndian.Uint32(c.head))
			if len(c.head) >= 4+size {
				body := c.head[4 : 4+size]
				id := int64(binary.BigEndian.Uint64(body[8:]))
				plen := int(binary.BigEndian.Uint32(body[16:]))
				c.s.mu.Lock()
				c.s.id, c.s.passwd = id, append([]byte(nil), body[20:20+plen]...)
				c.s.mu.Unlock()
				c.done = true
			}
		}
	}
	return n, err
}

// kill closes the session from a connection of its own: it reconnects with
// the session's id and password and sends closeSession.
func (s *session) kill(t testing.TB, addr string) {
	t.Helper()
	s.mu.Lock()
	id, passwd := s.id, s.passwd
	s.mu.Unlock()
	if id == 0 {
		t.Fatal("no session recorded")
	}
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// connect request: protocol version, last zxid seen, timeout, session
	// id, password
	req := binary.BigEndian.AppendUint32(nil, 0)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, uint32(sessionTimeout/time.Millisecond))
	req = binary.BigEndian.AppendUint64(req, uint64(id))
	req = binary.BigEndian.AppendUint32(req, uint32(len(passwd)))
	req = append(req, passwd...)
	send := func(body []byte) {
		if _, err := c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() []byte {
		var size [4]byte
		if _, err := io.ReadFull(c, size[:]); err != nil {
			t.Fatal(err)
		}
		body := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(c, body); err != nil {
			t.Fatal(err)
		}
		return body
	}
	send(req)
	if got := int64(binary.BigEndian.Uint64(recv()[8:])); got != id {
		t.Fatalf("reconnected to session %#x, want %#x", got, id)
	}
	// closeSession: xid 1, opcode -11
	send(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 1), uint32(0xfffffff5)))
	recv()
}

// A holder whose session is closed behind its back sees Done; Release then
// returns ErrLeaseLost, and the next holder's token is greater.
func TestSessionClosedBehindHoldersBack(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var s session
	l := newLockerDialer(t, addrs, s.dial)
	const name = "session-closed"
	for _, opts := range [][]fence.Option{nil, {fence.TTL(time.Minute)}} {
		lease, err := l.Acquire(ctx, name, opts...)
		if err != nil {
			t.Fatal(err)
		}
		other, _ := newLocker(t, addrs)
		if _, err := other.Acquire(ctx, name); !errors.Is(err, fence.ErrHeld) {
			t.Fatalf("Acquire while held = %v, want ErrHeld", err)
		}
		s.kill(t, srv.Addr)
		select {
		case <-lease.Done():
		case <-time.After(2 * sessionTimeout):
			t.Fatalf("lease still held %v after its session was closed", 2*sessionTimeout)
		}
		if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
			t.Fatalf("Err() = %v, want ErrLeaseLost", lease.Err())
		}
		t.Logf("Err() = %v", lease.Err())
		if err := lease.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release = %v, want ErrLeaseLost", err)
		}
		next, err := other.Acquire(ctx, name, fence.Wait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if next.Token() <= lease.Token() {
			t.Fatalf("next token %#x, want > %#x", next.Token(), lease.Token())
		}
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
