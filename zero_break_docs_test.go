package fence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
	"github.com/fencekit/fence/redislock"
	"github.com/fencekit/fence/redlock"
)

// TestLockerNotMadeByNewIsRefused: a careless user declares a Locker
// (var l redislock.Locker, &pglock.Locker{}, a nil *redlock.Locker) instead
// of calling New. Its calls must return an error matching
// fence.ErrInvalidOption, not ErrNotAcquired (it is not worth retrying), and
// never panic. Before: redislock's Acquire panicked with a nil dereference
// in a background goroutine (replicasync.go, expected), which killed the
// test binary (no recover can catch it); pglock's and redlock's panicked in
// Acquire itself.
func TestLockerNotMadeByNewIsRefused(t *testing.T) {
	var nilRedis *redislock.Locker
	var nilPG *pglock.Locker
	var nilRedlock *redlock.Locker
	lockers := map[string]fence.Locker{
		"zero redislock": &redislock.Locker{}, "nil redislock": nilRedis,
		"zero pglock": &pglock.Locker{}, "nil pglock": nilPG,
		"zero redlock": &redlock.Locker{}, "nil redlock": nilRedlock,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, fence.ErrInvalidOption) || errors.Is(err, fence.ErrNotAcquired) {
			t.Errorf("%s = %v; want an error matching fence.ErrInvalidOption and not ErrNotAcquired", what, err)
		}
	}
	for what, l := range lockers {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: Acquire panicked: %v", what, r)
				}
			}()
			lease, err := l.Acquire(ctx, "lock:payment:1001", fence.Wait(time.Second))
			if lease != nil {
				t.Errorf("%s: Acquire granted a lease", what)
			}
			check(what+": Acquire", err)
		}()
	}
	zr := &redislock.Locker{}
	_, err := zr.Status(ctx, "x")
	check("zero redislock: Status", err)
	_, err = zr.ReplicaCounts(ctx, "x")
	check("zero redislock: ReplicaCounts", err)
	check("zero redislock: SetExpectedReplicas", zr.SetExpectedReplicas(ctx, "x", 1))
	check("zero redislock: ReplicaSyncRefusal", zr.ReplicaSyncRefusal())
	check("zero pglock: EnsureSchema", (&pglock.Locker{}).EnsureSchema(ctx))
	_, err = (&redlock.Locker{}).Status(ctx, "x")
	check("zero redlock: Status", err)
}

// TestLeadOnLockerNotMadeByNew: Lead on such a Locker returns at once with
// the Acquire's error (matching fence.ErrInvalidOption), as Lead's doc
// promises for bad input, rather than campaign until its ctx ends.
func TestLeadOnLockerNotMadeByNew(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err := fence.Lead(ctx, &redislock.Locker{}, "leader", func(context.Context, fence.Lease) error { return nil })
	if !errors.Is(err, fence.ErrInvalidOption) || time.Since(start) > time.Second {
		t.Fatalf("Lead on a zero redislock.Locker = %v after %v; want ErrInvalidOption at once", err, time.Since(start))
	}
}
