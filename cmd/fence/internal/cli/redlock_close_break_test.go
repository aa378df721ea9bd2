package cli_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
)

// lockedAfterExit lists the nodes where name is locked, read the moment
// fence has exited.
func lockedAfterExit(t *testing.T, srvs []*redistest.Server, key string) []int {
	t.Helper()
	var on []int
	for i, s := range srvs {
		n, err := s.Client(t).Exists(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			on = append(on, i)
		}
	}
	return on
}

// hiccupLink is a TCP proxy to a server that forwards at once, except for
// one hiccup: once armed, the first chunk the client sends that holds
// trigger goes through, and whatever is sent after it, on any connection,
// is held until hiccup has passed. What is held when the client's side
// closes is dropped (as a request not yet written when its process died).
// Replies come back at once.
type hiccupLink struct {
	ln      net.Listener
	trigger []byte
	hiccup  time.Duration
	armed   atomic.Bool
	wg      sync.WaitGroup

	mu    sync.Mutex
	until time.Time // the hiccup's end, once triggered
	conns []net.Conn
}

func startHiccupLink(t *testing.T, upstream, trigger string, hiccup time.Duration) *hiccupLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &hiccupLink{ln: ln, trigger: []byte(trigger), hiccup: hiccup}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(c, u); _ = c.Close() })
			p.wg.Go(func() { p.forward(c, u) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *hiccupLink) addr() string { return p.ln.Addr().String() }

// due is when chunk b, read now, goes to the server.
func (p *hiccupLink) due(b []byte) time.Time {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.until.IsZero() && p.armed.Load() && bytes.Contains(b, p.trigger) {
		p.until = now.Add(p.hiccup)
		return now
	}
	if now.Before(p.until) {
		return p.until
	}
	return now
}

// forward copies c to u, each chunk when due; once c ends, the chunks not
// forwarded are dropped and u is closed.
func (p *hiccupLink) forward(c, u net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	chunks := make(chan chunk, 1024)
	gone := make(chan struct{})
	p.wg.Go(func() {
		defer close(gone)
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				b := append([]byte(nil), buf[:n]...)
				chunks <- chunk{b: b, due: p.due(b)}
			}
			if err != nil {
				return
			}
		}
	})
	defer u.Close()
	for {
		select {
		case <-gone:
			return // the client went: what is still held back is lost
		case ch := <-chunks:
			t := time.NewTimer(time.Until(ch.due))
			select {
			case <-gone:
				t.Stop()
				return
			case <-t.C:
			}
			if _, err := u.Write(ch.b); err != nil {
				return
			}
		}
	}
}

// fence exec --redlock whose command exits at once, with node 2 behind a
// link that hiccups (holds what is sent for 500 ms) right after the
// acquisition went through: node 2 grants the lock, and Release's delete
// to it is held back when the command has already exited. exec must wait
// for that delete before it exits (Close): the moment it has exited, no
// node is locked, and it warned of nothing. Without Close the delete is
// dropped with the process and node 2 stays locked for the lease time
// (even in the first run, without a hiccup: Release returns at the two
// fast replies, and the third delete is still on its way when a command
// that exits at once lets exec exit).
func TestExecRedlockQuickCommandHiccup(t *testing.T) {
	var srvs []*redistest.Server
	for range 3 {
		srvs = append(srvs, redistest.Start(t))
	}
	key := redlock.DefaultPrefix + ":{quick}"
	link := startHiccupLink(t, srvs[2].Addr, key+":token", 500*time.Millisecond)
	urls := strings.Join([]string{redisURL(srvs[0]), redisURL(srvs[1]), "redis://" + link.addr()}, ",")
	// The first run loads the scripts on every node (no NOSCRIPT round
	// trip behind the trigger), without a hiccup.
	for round := range 3 {
		link.armed.Store(round > 0)
		link.mu.Lock()
		link.until = time.Time{}
		link.mu.Unlock()
		start := time.Now()
		_, errOut, code := fence(t, nil, "exec", "--redlock", urls, "quick", "--", "true")
		took := time.Since(start)
		if code != 0 {
			t.Fatalf("round %d: exec --redlock: exit %d: %s", round, code, errOut)
		}
		if on := lockedAfterExit(t, srvs, key); len(on) != 0 {
			t.Fatalf("round %d: locked on nodes %v the moment exec exited (after %v): the delete held back by the hiccup died with the process", round, on, took)
		}
		if strings.Contains(errOut, "not finished") {
			t.Fatalf("round %d: exec warned: %s", round, errOut)
		}
		link.mu.Lock()
		triggered := !link.until.IsZero()
		link.mu.Unlock()
		if round > 0 && !triggered {
			t.Fatalf("round %d: the acquisition never went through the link", round)
		}
		t.Logf("round %d: exec took %v", round, took)
	}
	// A failed exec (the lock held by another owner on nodes 0 and 1)
	// whose try node 2 granted: the try's release there, held back by
	// the hiccup, must not die with the process either.
	for _, s := range srvs[:2] {
		if err := s.Client(t).Set(context.Background(), key, "someone-else", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	link.mu.Lock()
	link.until = time.Time{}
	link.mu.Unlock()
	_, errOut, code := fence(t, nil, "exec", "--redlock", urls, "quick", "--", "true")
	if code == 0 {
		t.Fatalf("exec of a lock held on a majority succeeded: %s", errOut)
	}
	if on := lockedAfterExit(t, srvs[2:], key); len(on) != 0 {
		t.Fatalf("node 2 locked by the failed try the moment exec exited: %s", errOut)
	}
}
