package fencerueidis_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// beforeEval is a rueidis dialer whose connections, once armed, run f
// before the first write that carries a script in full (EVAL): the one
// sent again after NOSCRIPT, once the first pipeline's WAIT has answered.
type beforeEval struct {
	mu    sync.Mutex
	f     func()
	fired int
}

func (h *beforeEval) arm(f func()) {
	h.mu.Lock()
	h.f = f
	h.mu.Unlock()
}

func (h *beforeEval) dial(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &evalConn{Conn: c, h: h}, nil
}

type evalConn struct {
	net.Conn
	h *beforeEval
}

func (c *evalConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("$4\r\nEVAL\r\n")) {
		c.h.mu.Lock()
		f := c.h.f
		c.h.f = nil
		if f != nil {
			c.h.fired++
		}
		c.h.mu.Unlock()
		if f != nil {
			f()
		}
	}
	return c.Conn.Write(p)
}

// TestNoScriptResentWait: as redislock's TestNoScriptResentWaitCountsItsOwn
// and TestNoScriptAfterBusyServer, on rueidis. The first WAIT counts the
// replica at once; then (1) the replica is stopped just before EVAL goes
// out: the acquisition must be refused, its lock given back; (2) the server
// was held (CLIENT PAUSE) longer than the sync timeout before the first
// pipeline ran, and the replica stalls 150 ms of a 400 ms timeout as EVAL
// goes out: the acquisition must be confirmed (the busy server, not the
// replica, used up the time; a WAIT left a millisecond refused it).
func TestNoScriptResentWait(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	pauser := primary.Client(t)
	h := &beforeEval{}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{primary.Addr}, DialCtxFn: h.dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	const (
		timeout = 400 * time.Millisecond
		stall   = 150 * time.Millisecond
	)
	l := newLocker(t, rc, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: timeout}})
	lease, err := l.Acquire(ctx(t), "warm", fence.TTL(time.Minute)) // the scripts cached
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	flush := func() {
		redistest.WaitReplicated(t, primary, 1)
		if err := admin.ScriptFlush(ctx(t)).Err(); err != nil {
			t.Fatal(err)
		}
		redistest.WaitReplicated(t, primary, 1)
	}

	flush()
	var resume func()
	h.arm(func() { resume = replica.Pause(t) })
	const name = "noscript-paused"
	_, err = l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("Acquire with the replica stopped before the script was sent again = %v, want ErrNotReplicated", err)
	}
	if resume == nil {
		t.Fatal("the script was not sent again in full: the test did not test NOSCRIPT")
	}
	if n, err := admin.Exists(ctx(t), lockKey(name)).Result(); err != nil || n != 0 {
		t.Fatalf("after the refused acquisition the lock key exists (%d, %v): not given back", n, err)
	}
	resume()

	for i := range 3 {
		flush()
		if err := pauser.Do(ctx(t), "CLIENT", "PAUSE", (2 * timeout).Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		var resumed sync.WaitGroup
		resumed.Add(1)
		h.arm(func() {
			resume := replica.Pause(t)
			time.AfterFunc(stall, func() { resume(); resumed.Done() }) // the replica's stall
		})
		start := time.Now()
		lease, err := l.Acquire(ctx(t), fmt.Sprintf("busy:%d", i), fence.TTL(time.Minute))
		took := time.Since(start)
		h.mu.Lock()
		fired := h.fired
		h.f = nil
		h.mu.Unlock()
		if fired != i+2 {
			t.Fatalf("round %d: the script was not sent again in full", i)
		}
		resumed.Wait()
		if err != nil {
			t.Fatalf("round %d: Acquire = %v after %v, want the lease (the replica stalled %v of a %v timeout)", i, err, took, stall, timeout)
		}
		t.Logf("round %d: acquired in %v", i, took)
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
}
