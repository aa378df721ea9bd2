package redistest

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"time"
)

// Dropper is a go-redis Dialer (redis.Options.Dialer) whose connections,
// once armed, let the next write that contains a given byte string through
// to the server, then swallow the server's reply and fail the read with
// io.EOF, as a connection that broke after the request was delivered: the
// command ran, the client cannot know it, and go-redis (MaxRetries, 3 by
// default) sends it again on a fresh connection.
type Dropper struct {
	match []byte

	mu      sync.Mutex
	armed   bool
	dropped int
	let     <-chan struct{} // nil: the reply is lost as it comes (see Until)
}

// NewDropper returns a Dropper of the replies to writes that contain match;
// it drops nothing until Arm.
func NewDropper(match string) *Dropper { return &Dropper{match: []byte(match)} }

// Arm makes the next matching write's reply be dropped (one reply per Arm).
func (d *Dropper) Arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed = true
}

// Until makes a dropped reply be lost only once let is closed (or 20 s
// later), the read that took it held until then: a link that died a while
// after the reply left the server.
func (d *Dropper) Until(let <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.let = let
}

// Dropped is how many replies were dropped.
func (d *Dropper) Dropped() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dropped
}

// Dial dials addr and wraps the connection; its signature is
// redis.Options.Dialer's.
func (d *Dropper) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &dropConn{Conn: c, d: d}, nil
}

type dropConn struct {
	net.Conn
	d    *Dropper
	drop bool // the last write was the armed one: drop its reply
}

func (c *dropConn) Write(p []byte) (int, error) {
	c.d.mu.Lock()
	if c.d.armed && bytes.Contains(p, c.d.match) {
		c.d.armed, c.drop = false, true
		c.d.dropped++
	}
	c.d.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *dropConn) Read(p []byte) (int, error) {
	if !c.drop {
		return c.Conn.Read(p)
	}
	c.drop = false
	// Wait for (the start of) the reply, so that the command has surely
	// run, then lose it with the connection.
	if err := c.Conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return 0, err
	}
	if _, err := c.Conn.Read(make([]byte, 512)); err != nil {
		return 0, err
	}
	c.d.mu.Lock()
	let := c.d.let
	c.d.mu.Unlock()
	if let != nil {
		select {
		case <-let:
		case <-time.After(20 * time.Second):
		}
	}
	_ = c.Conn.Close()
	return 0, io.EOF
}
