package fencerueidis

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redisconn"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// closingOnce is a rueidis client that answers one EVALSHA, once armed,
// with rueidis.ErrClosing while it is open: as rueidis's Sentinel client
// does to a call that picked the primary's connection just before a
// switch closed it (it swaps the new connection in, then closes the old
// one, whose closed blocking pool hands out a dead connection).
type closingOnce struct {
	rueidis.Client
	armed    atomic.Bool
	failedAt atomic.Int64 // UnixNano of the call it failed
}

func (c *closingOnce) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if cs := cmd.Commands(); len(cs) > 0 && cs[0] == "EVALSHA" && c.armed.CompareAndSwap(true, false) {
		c.failedAt.Store(time.Now().UnixNano())
		return rueidis.NewErrorResult(rueidis.ErrClosing)
	}
	return c.Client.Do(ctx, cmd)
}

// TestRenewalClosingOnOpenClientKeepsLease: a watchdog renewal that
// rueidis answers with ErrClosing while the client is open (its closed
// flag clear) is a failed renewal, retried, not the client closed: the
// lease goes on. It ended at once, lost, its error matching
// fence.ErrClosed (redislock takes that at its word, without the PING it
// asks go-redis), and fence.Lead would have stopped on it: the adapter
// made every ErrClosing match fence.ErrClosed, whatever the flag said.
func TestRenewalClosingOnOpenClientKeepsLease(t *testing.T) {
	srv := redistest.Start(t)
	real, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(real.Close)
	c := &closingOnce{Client: real}
	const ttl = 3 * time.Second
	nl, err := redisconn.NewLocker(conn{c, new(atomic.Int32), &unsubs{m: make(map[string]chan struct{})}, new(subscribers), stopFlag(real), false},
		&redislock.Options{WatchdogTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := nl.(*redislock.Locker).Acquire(ctx, "lock:closing-open")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	c.armed.Store(true)
	// Until a renewal after the failed one has moved the deadline (one
	// before it left less than 0.9 ttl past the failure), or the lease
	// ended.
	deadline := time.Now().Add(20 * time.Second)
	for lease.Err() == nil {
		if at := c.failedAt.Load(); at != 0 && lease.Deadline().After(time.Unix(0, at).Add(ttl*9/10)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no renewal after the failed one within 20 s")
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("lease ended, its client open: %v", err)
	}
}
