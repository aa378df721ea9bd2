package fencerueidis_test

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// refusedDials counts dials to addr that failed.
type refusedDials struct {
	addr   string
	failed atomic.Int64
}

func (d *refusedDials) dial(ctx context.Context, addr string, nd *net.Dialer, _ *tls.Config) (net.Conn, error) {
	c, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil && addr == d.addr {
		d.failed.Add(1)
	}
	return c, err
}

// TestWaitRidesOutSentinelFailover: as redislock's test of that name, on
// rueidis's Sentinel client. Four callers wait (20 s budgets) on a lock
// whose primary dies; until Sentinel promotes a replica their tries fail,
// and they must keep trying (the errors rueidis gives meanwhile must read
// as transient), then all take the lock on the new primary once the
// holder's lease there runs out, with tokens larger than the holder's.
func TestWaitRidesOutSentinelFailover(t *testing.T) {
	for _, resp2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "resp3", true: "resp2"}[resp2], func(t *testing.T) { waitRidesOutSentinelFailover(t, resp2) })
	}
}

func waitRidesOutSentinelFailover(t *testing.T, resp2 bool) {
	primary := redistest.Start(t)
	r1, r2 := redistest.StartReplica(t, primary), redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 2)
	sentinels := redistest.StartSentinels(t, primary, 3)
	redistest.WaitSentinelsReady(t, sentinels, 2)
	d := &refusedDials{addr: primary.Addr}
	newClient := func() rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: sentinels.Addrs(), DialCtxFn: d.dial, AlwaysRESP2: resp2, DisableCache: resp2,
			Sentinel: rueidis.SentinelOption{MasterSet: sentinels.Master}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	setDownAfter := func(ms string) {
		for _, addr := range sentinels.Addrs() {
			sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
			err := sc.Set(ctx(t), sentinels.Master, "down-after-milliseconds", ms).Err()
			_ = sc.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	const name = "lock:payment:1001"
	holder, err := newLocker(t, newClient(), redislock.Options{}).Acquire(ctx(t), name, fence.TTL(12*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, newClient(), redislock.Options{})
	var wg sync.WaitGroup
	tokens := make([]fence.Token, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Go(func() {
			lease, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
			if err != nil {
				errs[i] = err
				return
			}
			tokens[i] = lease.Token()
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			errs[i] = lease.Release(rctx)
		})
	}
	admin := primary.Client(t)
	ch := lockKey(name) + ":released"
	waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1 })

	setDownAfter("60000")
	start := time.Now()
	primary.Kill()
	waitFor(t, func() bool { return d.failed.Load() >= 5 })
	t.Logf("%d failed dials in %v; letting the sentinels fail over", d.failed.Load(), time.Since(start).Round(time.Millisecond))
	setDownAfter("1000")
	promoted := redistest.WaitFailover(t, sentinels, primary, r1, r2)
	t.Logf("sentinel promoted %s after %v", promoted.Addr, time.Since(start).Round(time.Millisecond))
	wg.Wait()
	t.Logf("all waiters done %v after the kill; tokens %v", time.Since(start).Round(time.Millisecond), tokens)
	seen := map[fence.Token]bool{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("waiter %d: %v", i, err)
			continue
		}
		if tokens[i] <= holder.Token() || seen[tokens[i]] {
			t.Errorf("waiter %d: token %d, want > %d and unique", i, tokens[i], holder.Token())
		}
		seen[tokens[i]] = true
	}
}
