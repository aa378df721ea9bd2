package redislock_test

import (
	"errors"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// refusingLocker returns a Locker on srv whose dials are refused while
// lr.refuse holds (lr starts refusing).
func refusingLocker(t *testing.T, srv *redistest.Server, o *redis.Options) (*redislock.Locker, *lostReply, *redis.Client) {
	t.Helper()
	lr := &lostReply{refuse: true}
	opts := redis.Options{Addr: srv.Addr, Dialer: lr.dial, DialerRetries: 1, MaxRetries: 1}
	if o != nil {
		opts = *o
		opts.Addr, opts.Dialer = srv.Addr, lr.dial
	}
	c := redis.NewClient(&opts)
	t.Cleanup(func() { _ = c.Close() })
	return lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}), lr, c
}

func heapInUse() uint64 {
	var m runtime.MemStats
	for range 2 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestParkedGiveBackSize: the doc says that, while a server is down, each
// failed Acquire holds under a kilobyte for its lease time (its parked
// give-back). A flood of refused Acquires, measured.
func TestParkedGiveBackSize(t *testing.T) {
	srv := redistest.Start(t)
	l, _, _ := refusingLocker(t, srv, nil)
	// Warm up: the name's keys cached, the parking's goroutine started.
	if _, err := l.Acquire(ctx(t), "lock:flood", fence.TTL(time.Hour)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Acquire with every dial refused: %v", err)
	}
	const n, workers = 1000, 20
	c := ctx(t) // one: each ctx(t) holds its timer until the test ends
	before := heapInUse()
	errs := make(chan error, workers)
	for range workers {
		go func() {
			for range n / workers {
				if _, err := l.Acquire(c, "lock:flood", fence.TTL(time.Hour)); !errors.Is(err, syscall.ECONNREFUSED) {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatalf("Acquire with every dial refused: %v", err)
		}
	}
	after := heapInUse()
	if got := redislock.Parked(l); got != n+1 {
		t.Fatalf("%d parked, want %d", got, n+1)
	}
	per := (int64(after) - int64(before)) / n
	t.Logf("%d bytes per parked give-back", per)
	if per >= 1024 {
		t.Fatalf("each refused Acquire holds %d bytes while the server is down; the doc says under a kilobyte", per)
	}
}
