package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// TestLazyLeaseConcurrentWatchers: Context, Done, Err and Deadline called
// from many goroutines while the lease is released, or while its deadline
// passes, must agree (run with -race): every Done channel handed out is
// closed, with the reason Err gives as its context's cause.
func TestLazyLeaseConcurrentWatchers(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, end := range []string{"release", "expiry"} {
		t.Run(end, func(t *testing.T) {
			for round := range 20 {
				ttl := time.Minute
				if end == "expiry" {
					ttl = fence.MinTTL + time.Duration(round)*time.Millisecond
				}
				fl, err := l.Acquire(ctx, "lock:payment:1001", fence.TTL(ttl))
				for end == "expiry" && errors.Is(err, fence.ErrLeaseLost) && ctx.Err() == nil {
					// A lease of 10 ms ran out before its reply came (a
					// loaded machine): the lock is given back; try again,
					// waiting for that.
					fl, err = l.Acquire(ctx, "lock:payment:1001", fence.TTL(ttl), fence.Wait(5*time.Second))
				}
				if err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				dones := make(chan (<-chan struct{}), 8)
				for i := range 8 {
					wg.Go(func() {
						if i%2 == 0 {
							dones <- fl.Done()
						} else {
							dones <- fl.Context().Done()
						}
						_ = fl.Err()
						_ = fl.Deadline()
					})
				}
				if end == "release" {
					wg.Go(func() { _ = fl.Release(ctx) })
				}
				wg.Wait()
				close(dones)
				for d := range dones {
					select {
					case <-d:
					case <-time.After(5 * time.Second):
						t.Fatalf("round %d: a Done channel not closed 5 s after the lease ended (Err %v)", round, fl.Err())
					}
				}
				want := fence.ErrReleased
				if end == "expiry" {
					want = fence.ErrLeaseLost
				}
				if err := fl.Err(); !errors.Is(err, want) {
					t.Fatalf("round %d: Err = %v, want %v", round, err, want)
				}
				if cause := context.Cause(fl.Context()); !errors.Is(cause, want) {
					t.Fatalf("round %d: cause = %v, want %v", round, cause, want)
				}
				_ = fl.Release(ctx)
			}
		})
	}
}

// runtimeYield pauses between polls of a condition that has a deadline.
func runtimeYield() { time.Sleep(time.Millisecond) }

// TestKeyCacheResetWithLiveLease: a lease whose name the key cache forgets
// (1024 other names locked since) still releases its lock, and its release
// still wakes a waiter of another Locker that found the lock held after the
// reset.
func TestKeyCacheResetWithLiveLease(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	const name = "lock:payment:1001"
	held, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	before := l.keys(name)
	for i := range maxCachedNames {
		ls, err := l.Acquire(ctx, fmt.Sprintf("other:%d", i), fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if l.keys(name) == before {
		t.Fatal("the key cache kept the name after 1024 others: the test does not reach the reset")
	}
	got := make(chan error, 1)
	start := time.Now()
	go func() {
		ls, err := l.Acquire(ctx, name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx)
		}
		got <- err
	}()
	queue := before.queue
	for deadline := time.Now().Add(10 * time.Second); srv.Client(t).LLen(ctx, queue).Val() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
		runtimeYield()
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release of a lease whose name the cache forgot: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the waiter took %v: the release did not wake it", took)
	}
}

// TestCallGoroutinesEndAfterUse: the call goroutines a Locker keeps for
// a client that does not bound its calls end by themselves once the Locker
// is idle, so a Locker dropped after use leaks none; one kept busy by a
// hung call ends when the call does.
func TestCallGoroutinesEndAfterUse(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 100 { // more at once than maxIdleCallers
		wg.Go(func() {
			ls, err := l.Acquire(ctx, fmt.Sprintf("lock:%d", i), fence.TTL(time.Minute))
			if err != nil {
				t.Error(err)
				return
			}
			if err := ls.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	l.calls.mu.Lock()
	idle := len(l.calls.idle)
	l.calls.mu.Unlock()
	if idle == 0 || idle > maxIdleCallers {
		t.Fatalf("%d idle call goroutines after 100 concurrent calls, want 1..%d", idle, maxIdleCallers)
	}
	_ = c.Close()
}
