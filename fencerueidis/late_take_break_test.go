package fencerueidis_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// gateConn holds each write that carries match (an acquire try of one
// lock) until the test opens the gate it put on gates.
type gateConn struct {
	net.Conn
	g *gates
}

type gates struct {
	match []byte
	held  chan chan struct{} // a write waiting, with the gate that lets it go
}

func (c *gateConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, c.g.match) {
		open := make(chan struct{})
		c.g.held <- open
		<-open
	}
	return c.Conn.Write(p)
}

// TestLateTakeRetryWithinBudget: through fencerueidis as through go-redis,
// an Acquire with a 2 s wait budget whose first try takes the lock with a
// reply past the lease's deadline gives it back and tries again with a new
// owner; that try is held on its way (the server hangs now). It must end
// with the budget: the try again ran on the caller's context alone, and
// rueidis has no read timeout of its own to end it.
func TestLateTakeRetryWithinBudget(t *testing.T) {
	const name, ttl, wait = "lock:late-take-retry-budget", 300 * time.Millisecond, 2 * time.Second
	srv := redistest.Start(t)
	lock := lockKey(name)
	g := &gates{match: fmt.Appendf(nil, "$1\r\n5\r\n$%d\r\n%s\r\n", len(lock), lock), held: make(chan chan struct{}, 4)}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr},
		DialFn: func(addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
			conn, err := d.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			return &gateConn{Conn: conn, g: g}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	var opened []chan struct{}
	t.Cleanup(func() {
		for _, o := range opened {
			close(o)
		}
		c.Close()
	})
	l := newLocker(t, c, redislock.Options{})
	probes := newLocker(t, client(t, srv.Addr), redislock.Options{})
	start := time.Now()
	type result struct {
		lease fence.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ls, err := l.Acquire(c, name, fence.TTL(ttl), fence.Wait(wait))
		got <- result{ls, err}
	}()
	first := <-g.held
	probe, err := probes.Acquire(ctx(t), name+":probe", fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	<-probe.Done()
	close(first) // delivered past the deadline of the lease it takes
	select {
	case again := <-g.held:
		opened = append(opened, again) // held until the end
	case <-time.After(10 * time.Second):
		t.Fatal("no try again after the late take")
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("Acquire has not returned after 20 s")
	}
	took := time.Since(start)
	if r.lease != nil {
		t.Fatalf("Acquire returned a lease (token %d) though its try again is held", r.lease.Token())
	}
	if !errors.Is(r.err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired", r.err)
	}
	t.Logf("Acquire after %v: %v", took.Round(time.Millisecond), r.err)
	if took > wait+time.Second {
		t.Errorf("Acquire with a %v budget returned after %v: its try again after the late take was not bounded by the budget", wait, took.Round(time.Millisecond))
	}
}
