package redislock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestFixedTTLExpiryMessage: a lease acquired with fence.TTL that reaches
// its deadline says that its lease time ran out. Before, it said that it
// "was not renewed before its deadline", the message of a watchdog whose
// renewals failed, so fence exec --ttl 1s reported a lease that ended as
// asked as if Redis had failed.
func TestFixedTTLExpiryMessage(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A wait budget: a first try slower than the lease time (a dial and
	// a script load on a loaded machine) is refused as late, and tried again.
	lease, err := l.Acquire(ctx, "fixed-ttl", fence.TTL(50*time.Millisecond), fence.Wait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
	case <-ctx.Done():
		t.Fatal("the lease did not end at its deadline")
	}
	if err := lease.Err(); err == nil || !strings.Contains(err.Error(), "lease time ran out") || strings.Contains(err.Error(), "not renewed") {
		t.Errorf("Err() = %v, want one saying its lease time ran out", err)
	}
}
