package redislock_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// A lease whose lock was removed behind its back (an operator, a
// failover), released while Redis refuses connections (restarting, say):
// the Release fails with ctx live but sends nothing, its dial refused. A
// Release retried once Redis answers finds the lock gone: nothing of the
// lease's own can have deleted it, so it must say fence.ErrLeaseLost
// (fence.Lease's Release), not nil. Before the fix a failed call with its
// ctx live counted as a delete that may have run, and the retry said nil.
func TestRetriedReleaseAfterRefusedDial(t *testing.T) {
	t.Skip("bug: the retry returns nil (a call failed with its ctx live counts as sent, relTried). " +
		"Taking a refused dial for 'nothing sent' is unsound too: go-redis retries a script whose " +
		"connection broke after it was written (io.EOF) and returns the last attempt's error, a refused " +
		"dial. Telling the two apart needs the release script to leave a mark of its own delete for the " +
		"retry to read (the last owner it released), a change of the scripts")
	srv := redistest.Start(t)
	admin := srv.Client(t)
	// A port nobody listens on: a dial to it is refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	var refuse atomic.Bool
	var d net.Dialer
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if refuse.Load() {
			addr = closed
		}
		return d.DialContext(ctx, network, addr)
	}})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "retried-release-after-refused-dial"
	ls := acquire(t, l, name, fence.TTL(30*time.Second))
	if err := admin.Del(ctx(t), lockKey(name)).Err(); err != nil {
		t.Fatal(err)
	}
	// Every connection of the client is closed, and no new one is let in.
	refuse.Store(true)
	if err := admin.ClientKillByFilter(ctx(t), "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	first := ls.Release(ctx(t))
	refuse.Store(false)
	var op *net.OpError
	if !errors.As(first, &op) || op.Op != "dial" {
		t.Fatalf("Release while connections are refused = %v, want a refused dial", first)
	}
	if err := ls.Release(ctx(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release retried (the first sent nothing: %v) of a lease whose lock was removed = %v, want ErrLeaseLost", first, err)
	}
}
