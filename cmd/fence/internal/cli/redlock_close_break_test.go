package cli_test

import (
	"bytes"
	"context"
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

// hiccupLink is a delayLink that forwards at once, except for one hiccup:
// once armed, the first chunk the client sends that holds trigger goes
// through, and whatever is sent after it, on any connection, is held until
// hiccup has passed.
type hiccupLink struct {
	*delayLink
	trigger []byte
	hiccup  time.Duration
	armed   atomic.Bool

	mu    sync.Mutex
	until time.Time // the hiccup's end, once triggered
}

func startHiccupLink(t *testing.T, upstream, trigger string, hiccup time.Duration) *hiccupLink {
	p := &hiccupLink{trigger: []byte(trigger), hiccup: hiccup}
	p.delayLink = startDelayLink(t, upstream, p.due)
	return p
}

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
	t.Parallel()
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
