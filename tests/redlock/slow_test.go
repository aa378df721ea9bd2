package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// slow puts an in-process toxiproxy in front of srv that delays every
// request (client to server) by latency, and returns its address.
func slow(t *testing.T, srv *redistest.Server, latency time.Duration) string {
	t.Helper()
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	proxy := toxiproxy.NewProxy(api, "slow-"+srv.Port(), "127.0.0.1:0", srv.Addr)
	if err := proxy.Start(); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	t.Cleanup(proxy.Stop)
	toxic := fmt.Sprintf(`{"name":"slow","type":"latency","stream":"upstream","toxicity":1,"attributes":{"latency":%d}}`, latency.Milliseconds())
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		t.Fatalf("toxiproxy latency: %v", err)
	}
	return proxy.Listen
}

func client(t *testing.T, addr string) redis.UniversalClient {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func lockKey(name string) string { return redlock.DefaultPrefix + ":{" + name + "}" }

// locked reports whether name is locked on srv, read directly.
func locked(t *testing.T, srv *redistest.Server, name string) bool {
	t.Helper()
	n, err := srv.Client(t).Exists(ctxFor(t), lockKey(name)).Result()
	if err != nil {
		t.Fatalf("EXISTS: %v", err)
	}
	return n == 1
}

// A node slower than the per-node timeout is skipped: the acquisition
// succeeds on the other two within about the timeout, and the slow node's
// late acquisition does not keep the lock there.
func TestSlowNodeSkipped(t *testing.T) {
	srvs := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	// A node timeout that a loaded machine's round trip under -race stays well
	// within (50 ms did not, for a Release in a full make test).
	const nodeTimeout, latency = 300 * time.Millisecond, 2 * time.Second
	l, err := redlock.New([]redis.UniversalClient{
		client(t, srvs[0].Addr), client(t, srvs[1].Addr), client(t, slow(t, srvs[2], latency)),
	}, &redlock.Options{NodeTimeout: nodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	const name = "slow"
	// A Locker's first acquisition first pings every node (their first
	// dials are not counted against the node timeout) and so waits for
	// the slow one; the second is the one timed.
	warm, err := l.Acquire(ctxFor(t), "warm-up", fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("warm-up Acquire: %v", err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatalf("warm-up Release: %v", err)
	}
	start := time.Now()
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Acquire with one slow node: %v", err)
	}
	if took >= latency {
		t.Fatalf("Acquire took %v: it waited for the slow node (latency %v, node timeout %v)", took, latency, nodeTimeout)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	t.Logf("acquired in %v with one node %v away (node timeout %v)", took, latency, nodeTimeout)
	// Released on the majority: the lock is free again at once.
	again, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("Acquire after the release: %v", err)
	}
	if again.Token() <= lease.Token() {
		t.Fatalf("token %d after %d", again.Token(), lease.Token())
	}
	if err := again.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// Latency on every node that eats the lease time: the nodes grant, but the
// validity left is not positive, so Acquire fails rather than hand out a
// lease whose deadline has passed, and nothing stays locked. (Latency
// longer than the lease on one round trip is cut short by the per-node
// timeout, which never exceeds the lease time less the drift: no quorum.)
func TestLatencyEatsValidity(t *testing.T) {
	srvs := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	const ttl, latency = 200 * time.Millisecond, 120 * time.Millisecond
	var cs []redis.UniversalClient
	for _, s := range srvs {
		cs = append(cs, client(t, slow(t, s, latency)))
	}
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Connected, and the scripts loaded (the write-back's too, on every
	// node, straight from its source: which nodes a try writes back to
	// depends on which answer first), as on a long-lived Locker: a dial,
	// its handshake and a NOSCRIPT round trip would add latencies.
	maxLua, err := os.ReadFile(filepath.Join("..", "..", "redlock", "max.lua"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range srvs {
		if err := s.Client(t).ScriptLoad(ctxFor(t), string(maxLua)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Token records ahead, and apart, on nodes 0 and 1 (their clocks
	// were, say): whichever two nodes make the majority that Acquire
	// decides on, one answers a smaller token than the other.
	ahead := time.Now().Add(time.Hour).UnixMicro()
	for _, name := range []string{"warm-up", "eaten"} {
		for i, rec := range []int64{ahead, ahead + 1000} {
			if err := srvs[i].Client(t).Set(ctxFor(t), lockKey(name)+":token", rec, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	warm, err := l.Acquire(ctxFor(t), "warm-up", fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("warm-up Acquire: %v", err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatalf("warm-up Release: %v", err)
	}
	const name = "eaten"
	// The majority's tokens differ: the smaller needs the write-back, a
	// second round trip. One round trip of 120 ms fits in the lease; two
	// do not.
	start := time.Now()
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err == nil {
		t.Fatalf("Acquire through %v of latency per request, a lease of %v succeeded, deadline %v after the start", latency, ttl, lease.Deadline().Sub(start))
	}
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, redlock.ErrValidity) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired and ErrValidity", err)
	}
	for i, s := range srvs {
		if locked(t, s, name) {
			t.Fatalf("the lock stayed on node %d", i)
		}
	}
	t.Logf("refused after %v: %v", time.Since(start), err)
}
