package redislock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
)

// A careless configuration: a guard store given redislock's prefix
// ("fence") writes its token record for resource "job" on the key of the
// lock "job" (fence:{job}), with no expiry. Every Acquire of the lock then
// finds it held, for good: the error said only "held by another owner",
// whatever the wait, while nobody held it. It must still match
// fence.ErrHeld (the key is not the Locker's to delete) and say that the
// key has no expiry, which no lock of redislock's has, and what frees it.
func TestPersistentKeyHeldSaysWhy(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := redisstore.Store{Client: c, Prefix: "fence"}
	if err := store.Accept(ctx, "job", 7); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, lockKey("job")).Val(); ttl >= 0 {
		t.Fatalf("the store's record on the lock's key has a TTL (%v): the premise is gone", ttl)
	}
	l := newLocker(t, c)
	for _, wait := range []time.Duration{0, 300 * time.Millisecond} {
		_, err := l.Acquire(ctx, "job", fence.Wait(wait))
		t.Logf("Acquire (wait %v) = %v", wait, err)
		if !errors.Is(err, fence.ErrHeld) || !strings.Contains(err.Error(), "no expiry") {
			t.Errorf("Acquire (wait %v) on a key without expiry = %v, want fence.ErrHeld saying the key has no expiry", wait, err)
		}
	}
}
