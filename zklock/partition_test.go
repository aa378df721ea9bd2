package zklock_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// partition is a zk.Dialer whose connections the test can cut, and whose
// new connections it can refuse: the client cannot reach ZooKeeper, as
// when its host is partitioned away or paused.
type partition struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (p *partition) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return nil, errors.New("partitioned")
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err == nil {
		p.conns = append(p.conns, c)
	}
	return c, err
}

// set cuts the client off (closing its connections) or heals the partition.
func (p *partition) set(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.conns = nil
	}
}

// A short connection loss is not an expiry: the lease goes on and its
// Deadline moves again. A loss longer than the session timeout ends the
// lease at its Deadline, before the client hears of the expiry; the next
// holder's token is greater.
func TestPartitionedHolder(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var p partition
	l := newLockerDialer(t, addrs, p.dial)
	const name = "partitioned"
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}

	p.set(true)
	cutAt := time.Now()
	before := lease.Deadline()
	waitFor(t, func() bool { return time.Since(cutAt) > sessionTimeout/4 })
	p.set(false)
	waitFor(t, func() bool { return lease.Deadline().After(before) })
	if err := lease.Err(); err != nil {
		t.Fatalf("lease ended after a connection loss of %v: %v", sessionTimeout/4, err)
	}

	p.set(true)
	last := lease.Deadline()
	select {
	case <-lease.Done():
	case <-time.After(2 * sessionTimeout):
		t.Fatalf("lease still held %v into a partition", 2*sessionTimeout)
	}
	if time.Now().Before(last) {
		t.Fatalf("lease ended before its deadline %v", last)
	}
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", lease.Err())
	}
	t.Logf("Err() = %v, ended %v after its deadline", lease.Err(), time.Since(last))
	other, _ := newLocker(t, addrs)
	next, err := other.Acquire(ctx, name, fence.Wait(3*sessionTimeout))
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= lease.Token() {
		t.Fatalf("next token %#x, want > %#x", next.Token(), lease.Token())
	}
	p.set(false)
	if err := lease.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
