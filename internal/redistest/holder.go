package redistest

import (
	"bytes"
	"context"
	"net"
	"sync"
)

// Holder is a go-redis Dialer (redis.Options.Dialer) whose connections,
// while it is armed, hold back the writes that contain a given byte string,
// as a network that delays a request: the client's write returns, its read
// waits, and the server gets the request only when Let sends it. A client
// that gave up on such a request meanwhile and sent others on other
// connections then sees the server run the old request after the new ones.
type Holder struct {
	match []byte

	mu    sync.Mutex
	armed bool
	held  []heldWrite
}

type heldWrite struct {
	conn net.Conn
	p    []byte
}

// NewHolder returns a Holder of the writes that contain match; it holds
// nothing until Arm.
func NewHolder(match string) *Holder { return &Holder{match: []byte(match)} }

// Dial dials addr and wraps the connection; its signature is
// redis.Options.Dialer's.
func (h *Holder) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &holdConn{Conn: c, h: h}, nil
}

// Arm makes the connections hold every matching write until Disarm.
func (h *Holder) Arm() { h.set(true) }

// Disarm lets matching writes through again (those held stay held).
func (h *Holder) Disarm() { h.set(false) }

func (h *Holder) set(armed bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = armed
}

// Held is how many writes are held.
func (h *Holder) Held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}

// Let sends the held writes, each on its own connection, in the order they
// were held, and returns the first error (a connection the client closed
// meanwhile).
func (h *Holder) Let() error {
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	var first error
	for _, w := range held {
		if _, err := w.conn.Write(w.p); err != nil && first == nil {
			first = err
		}
	}
	return first
}

type holdConn struct {
	net.Conn
	h *Holder
}

func (c *holdConn) Write(p []byte) (int, error) {
	h := c.h
	h.mu.Lock()
	if h.armed && bytes.Contains(p, h.match) {
		h.held = append(h.held, heldWrite{c.Conn, bytes.Clone(p)})
		h.mu.Unlock()
		return len(p), nil
	}
	h.mu.Unlock()
	return c.Conn.Write(p)
}
