package etcdlock_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// TestHugeTTL: fence.TTL accepts any lease time from fence.MinTTL up, and a
// careless "forever" is time.Duration(math.MaxInt64). etcdlock rounded it
// up to whole seconds with ttl + 1s - 1, which overflows: etcd was asked
// for a negative TTL, raised it to its minimum (seconds), and expired the
// key then, while the lease's Deadline said 292 years. A holder cut off
// from etcd (no watch event) believes it holds the lock while the next
// holder has it. Before: "fence.TTL(2562047h47m16.854775807s): etcd granted
// a lease of 2s (TTL left 1s), but Deadline is 2536427h0m0s away". Now a
// lease time past etcd's maximum (9e9 s) is refused before anything is
// sent, with fence.ErrInvalidOption, by Acquire, Extend and New.
func TestHugeTTL(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, nil)
	ctx := ctxFor(t, 30*time.Second)
	for _, ttl := range []time.Duration{math.MaxInt64, math.MaxInt64 - time.Second/2} {
		lease, err := l.Acquire(ctx, "huge-ttl", fence.TTL(ttl))
		if errors.Is(err, fence.ErrInvalidOption) {
			continue
		}
		if err != nil {
			t.Fatalf("Acquire with fence.TTL(%v) = %v; want a lease or fence.ErrInvalidOption", ttl, err)
		}
		id := leaseID(t, lease)
		ttlResp, err := admin.TimeToLive(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		granted := time.Duration(ttlResp.GrantedTTL) * time.Second
		if left := time.Until(lease.Deadline()); left > granted {
			t.Errorf("fence.TTL(%v): etcd granted a lease of %v (TTL left %ds), but Deadline is %v away", ttl, granted, ttlResp.TTL, left.Round(time.Hour))
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Just within etcd's maximum: granted, and the etcd lease is as long.
	const most = 9_000_000_000 * time.Second
	lease, err := l.Acquire(ctx, "huge-ttl", fence.TTL(most))
	if err != nil {
		t.Fatalf("Acquire with fence.TTL(%v), etcd's maximum = %v", most, err)
	}
	ttlResp, err := admin.TimeToLive(ctx, leaseID(t, lease))
	if err != nil {
		t.Fatal(err)
	}
	if granted := time.Duration(ttlResp.GrantedTTL) * time.Second; granted < most {
		t.Errorf("fence.TTL(%v): etcd granted %v", most, granted)
	}
	if err := lease.Extend(ctx, math.MaxInt64); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("Extend(%v) = %v; want fence.ErrInvalidOption", time.Duration(math.MaxInt64), err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := etcdlock.New(admin, &etcdlock.Options{WatchdogTTL: math.MaxInt64}); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("New with WatchdogTTL %v = %v; want fence.ErrInvalidOption", time.Duration(math.MaxInt64), err)
	}
}
