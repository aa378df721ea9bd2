package redislock

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestWaiterSurvivesFailedResubscribe: when a lock's slot moves, Redis
// drops the shard channel's subscribers and the waiters' reader subscribes
// again on the slot's new owner. If that first attempt fails (the new
// owner cannot be reached for a moment), the reader must keep trying
// rather than give the subscription up: a waiter already on it would
// otherwise never hear of a release again and would sleep until the
// holder's TTL or its own budget ran out.
func TestWaiterSurvivesFailedResubscribe(t *testing.T) {
	t.Parallel() // own cluster and Lockers; mostly waits on the slot move (10 s slack)
	cluster := redistest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const name = "lock:payment:1001"

	var refuse atomic.Bool
	refused := make(chan struct{}, 1)
	var d net.Dialer
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: cluster.Addrs(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if refuse.Load() {
				select {
				case refused <- struct{}{}:
				default:
				}
				return nil, errors.New("test: dial refused")
			}
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	holderClient := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = holderClient.Close() })
	holders, err := New(holderClient, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	held, err := holders.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}

	type result struct {
		lease fence.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		got <- result{lease, err}
	}()
	channel := l.keys(name).channel
	eventually(t, func() bool { // the waiter is on a confirmed subscription
		l.mu.Lock()
		defer l.mu.Unlock()
		w := l.subscriptions[channel]
		if w == nil || len(w.waiters) == 0 {
			return false
		}
		select {
		case <-w.ready:
			return w.readyErr == nil
		default:
			return false
		}
	})

	// Move the slot while the waiter's client cannot dial.
	node, err := holderClient.MasterForKey(ctx, l.keys(name).lock)
	if err != nil {
		t.Fatal(err)
	}
	var from, to *redistest.Server
	for i, s := range cluster.Servers {
		if s.Addr == node.Options().Addr {
			from, to = s, cluster.Servers[(i+1)%len(cluster.Servers)]
		}
	}
	refuse.Store(true)
	if err := cluster.MigrateSlot(ctx, int(holderClient.ClusterKeySlot(ctx, l.keys(name).lock).Val()), from, to); err != nil {
		t.Fatal(err)
	}
	select {
	case <-refused: // the reader tried to subscribe on the new owner
	case <-ctx.Done():
		t.Fatal("the waiter's reader did not try to subscribe again after the move")
	}
	refuse.Store(false)

	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter = %v after %v; want the lock soon after the release", r.err, time.Since(released).Round(time.Millisecond))
	}
	if took := time.Since(released); took > 10*time.Second {
		t.Errorf("the waiter took the lock %v after the release: it missed it", took)
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
