package redislock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestObserverCountsConfigRefusal: a client whose read timeout (50 ms)
// leaves no room for replica sync's WAIT, on a primary with a replica, gets
// an error matching fence.ErrInvalidOption (inside fence.ErrNotAcquired)
// from every Acquire, found at the server. fence.ReportAcquire took it for
// invalid input and reported nothing: every acquisition failed and the
// metrics showed none. It must be reported, as an error.
func TestObserverCountsConfigRefusal(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	client := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: 50 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	rec := &observetest.Recorder{}
	l, err := redislock.New(client, &redislock.Options{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(ctx(t), "lock:observed-refusal")
	if !errors.Is(err, fence.ErrInvalidOption) || !errors.Is(err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire = %v; want fence.ErrInvalidOption inside fence.ErrNotAcquired", err)
	}
	// Invalid input is still not reported.
	if _, err := l.Acquire(ctx(t), "bad{name}"); !errors.Is(err, fence.ErrInvalidName) {
		t.Fatalf("Acquire with a brace = %v; want fence.ErrInvalidName", err)
	}
	evs := rec.Acquires()
	if len(evs) != 1 || evs[0].Result != fence.Failed || !errors.Is(evs[0].Err, fence.ErrInvalidOption) {
		t.Fatalf("reported %+v; want one AcquireEvent with Result %q", evs, fence.Failed)
	}
}
