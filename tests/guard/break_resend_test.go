package guard_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/redis/go-redis/v9"
)

// replyDropper is a go-redis Dialer whose connections, once armed, let the
// next write that contains match through to the server, then swallow the
// server's reply and fail the read with io.EOF, as a connection that broke
// after the request was delivered: the command ran, the client cannot
// know it, and go-redis (MaxRetries, 3 by default) sends it again on a
// fresh connection.
type replyDropper struct {
	match []byte

	mu      sync.Mutex
	armed   bool
	dropped int
}

func (d *replyDropper) arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed = true
}

func (d *replyDropper) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dropped
}

func (d *replyDropper) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &dropConn{Conn: c, d: d}, nil
}

type dropConn struct {
	net.Conn
	d    *replyDropper
	drop bool // the last write was the one armed for: drop its reply
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
	// Wait for the reply, so that the command has surely run, then lose it.
	buf := make([]byte, 512)
	if err := c.Conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return 0, err
	}
	if _, err := c.Conn.Read(buf); err != nil {
		return 0, err
	}
	_ = c.Conn.Close()
	return 0, io.EOF
}

// TestRedisStoreResentAcceptIsNotStale: the connection breaks after Redis
// ran Accept's script and before its reply arrives; go-redis, as it does
// by default, sends the script again. The resent script found the token
// it had just recorded and answered stale: a lone holder with the newest
// token was told that a newer one had been accepted (Gate answered 409),
// its work refused, its token spent. Accept must recognise its own resend
// and return nil; a second Accept of the same token (a replay) must still
// be stale.
func TestRedisStoreResentAcceptIsNotStale(t *testing.T) {
	prefix := "guardtest:resend:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	d := &replyDropper{match: []byte("{payment:1001}")}
	client := redis.NewClient(&redis.Options{Addr: redisAddr, Dialer: d.Dial}) // go-redis's default MaxRetries: 3
	t.Cleanup(func() { _ = client.Close() })
	s := redisstore.Store{Client: client, Prefix: prefix}

	// Load the script, so that the armed write is the EVALSHA that runs it.
	if err := s.Accept(ctx(t), "payment:1000", 1); err != nil {
		t.Fatal(err)
	}
	d.arm()
	if err := s.Accept(ctx(t), "payment:1001", 5); err != nil {
		t.Errorf("Accept(5), its first reply lost and the script resent = %v; want nil (no other token was ever sent)", err)
	}
	if n := d.count(); n != 1 {
		t.Fatalf("%d replies dropped; want 1", n)
	}
	var stale *guard.StaleError
	if err := s.Accept(ctx(t), "payment:1001", 5); !errors.As(err, &stale) || stale.Last != 5 {
		t.Errorf("Accept(5) again = %v; want a *StaleError with Last 5 (one Accept per token)", err)
	}
	if err := s.Accept(ctx(t), "payment:1001", 4); !errors.As(err, &stale) || stale.Last != 5 {
		t.Errorf("Accept(4) = %v; want a *StaleError with Last 5", err)
	}
	if err := s.Accept(ctx(t), "payment:1001", 6); err != nil {
		t.Errorf("Accept(6) = %v; want nil", err)
	}
}
