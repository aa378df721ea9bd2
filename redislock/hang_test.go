package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/silent"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// hangDeadline and hangSlack are issue 11's numbers: a caller's 750 ms
// deadline must bring every call back within 300 ms more, although
// go-redis's default ReadTimeout is 3 s.
const hangDeadline, hangSlack = 750 * time.Millisecond, 300 * time.Millisecond

// within runs call with a hangDeadline context and fails the test if it
// takes longer than hangDeadline + hangSlack or returns no error.
func within(t *testing.T, what string, call func(ctx context.Context) error) {
	t.Helper()
	dctx, cancel := context.WithTimeout(context.Background(), hangDeadline)
	defer cancel()
	start := time.Now()
	err := call(dctx)
	took := time.Since(start)
	t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
	if took > hangDeadline+hangSlack {
		t.Errorf("%s took %v with a %v deadline", what, took, hangDeadline)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%s = %v, want an error matching context.DeadlineExceeded", what, err)
	}
}

// TestHungRedisReturnsByDeadline: with go-redis's default options (no
// ContextTimeoutEnabled), a paused redis-server or a listener that never
// answers must not hold Acquire, Extend, Release or Status past the
// caller's deadline. With ContextTimeoutEnabled, where fence calls the
// client directly and relies on it to end the call at the deadline, neither
// must they.
func TestHungRedisReturnsByDeadline(t *testing.T) {
	for _, cte := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", cte), func(t *testing.T) {
			t.Parallel() // each on its own listener and server, mostly waiting out deadlines
			testHungRedis(t, cte)
		})
	}
}

func testHungRedis(t *testing.T, contextTimeout bool) {
	t.Run("silent-listener", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: silent.Addr(t), ContextTimeoutEnabled: contextTimeout})
		t.Cleanup(func() { _ = c.Close() })
		l := newLocker(t, c)
		for _, wait := range []time.Duration{0, 10 * time.Second} {
			within(t, "Acquire", func(ctx context.Context) error {
				_, err := l.Acquire(ctx, "lock:payment:1001", fence.Wait(wait))
				if err != nil && !errors.Is(err, fence.ErrNotAcquired) {
					t.Errorf("Acquire = %v, want ErrNotAcquired", err)
				}
				return err
			})
		}
		within(t, "Status", func(ctx context.Context) error { _, err := l.Status(ctx, "lock:payment:1001"); return err })
		within(t, "ReplicaCounts", func(ctx context.Context) error { _, err := l.ReplicaCounts(ctx, "lock:payment:1001"); return err })
		within(t, "SetExpectedReplicas", func(ctx context.Context) error { return l.SetExpectedReplicas(ctx, "lock:payment:1001", 0) })
	})
	t.Run("paused-server", func(t *testing.T) {
		srv := redistest.Start(t)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: contextTimeout})
		t.Cleanup(func() { _ = c.Close() })
		l := newLocker(t, c)
		held := acquire(t, l, "held", fence.TTL(time.Minute))
		srv.Signal(syscall.SIGSTOP)
		resumed := false
		resume := func() {
			if !resumed {
				resumed = true
				srv.Signal(syscall.SIGCONT)
			}
		}
		t.Cleanup(resume)
		for _, wait := range []time.Duration{0, 10 * time.Second} {
			within(t, "Acquire", func(ctx context.Context) error {
				_, err := l.Acquire(ctx, "lock:payment:1001", fence.Wait(wait), fence.TTL(time.Minute))
				return err
			})
		}
		within(t, "Extend", func(ctx context.Context) error { return held.Extend(ctx, time.Minute) })
		within(t, "Release", func(ctx context.Context) error { return held.Release(ctx) })
		within(t, "Status", func(ctx context.Context) error { _, err := l.Status(ctx, "held"); return err })
		within(t, "ReplicaCounts", func(ctx context.Context) error { _, err := l.ReplicaCounts(ctx, "held"); return err })
		within(t, "SetExpectedReplicas", func(ctx context.Context) error { return l.SetExpectedReplicas(ctx, "held", 0) })

		// The acquisitions given up on may sit in the server's socket and
		// run when it resumes; each is then given back or revoked, so
		// nothing is left held beyond a moment.
		resume()
		admin := srv.Client(t)
		waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey("lock:payment:1001")).Val() == 0 })
		// The Release given up on may or may not have reached the server
		// (a connection opened during the pause can time out in its
		// handshake first). Releasing again retries; "lost" is a fair
		// answer if the first one did run.
		if err := held.Release(ctx(t)); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release after the server resumed: %v", err)
		}
		if admin.Exists(ctx(t), lockKey("held")).Val() != 0 {
			t.Fatal("the lock is still held after Release")
		}
	})
}

// TestHungRedisNoSocketDeadlines: ContextTimeoutEnabled does not bound a
// call when the client is told never to set socket deadlines (ReadTimeout or
// WriteTimeout -2, go-redis's "disables SetReadDeadline calls completely"):
// the ctx deadline never reaches the socket. fence must not trust such a
// client to end its calls, and still return by the caller's deadline.
func TestHungRedisNoSocketDeadlines(t *testing.T) {
	t.Parallel() // own listeners; mostly waits out deadlines, as TestHungRedisReturnsByDeadline
	for _, o := range []redis.Options{
		{ReadTimeout: -2},
		{WriteTimeout: -2},
		{ReadTimeout: -2, WriteTimeout: -2},
	} {
		t.Run(fmt.Sprintf("ReadTimeout=%v,WriteTimeout=%v", o.ReadTimeout, o.WriteTimeout), func(t *testing.T) {
			o.Addr, o.ContextTimeoutEnabled = silent.Addr(t), true
			c := redis.NewClient(&o)
			l := newLocker(t, c)
			dctx, cancel := context.WithTimeout(context.Background(), hangDeadline)
			defer cancel()
			start := time.Now()
			done := make(chan error, 1)
			go func() {
				_, err := l.Acquire(dctx, "lock:payment:1001", fence.TTL(time.Minute))
				done <- err
			}()
			select {
			case err := <-done:
				took := time.Since(start)
				t.Logf("Acquire: %v after %v", err, took.Round(time.Millisecond))
				if took > hangDeadline+hangSlack || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Acquire = %v after %v, want context.DeadlineExceeded within %v", err, took, hangDeadline+hangSlack)
				}
			case <-time.After(hangDeadline + hangSlack + 2*time.Second):
				t.Errorf("Acquire still running %v after its %v deadline", time.Since(start)-hangDeadline, hangDeadline)
				_ = c.Close() // closes the pool's connections: the read ends
				<-done
			}
			_ = c.Close()
		})
	}
}

// TestReleaseByDeadlineWhileRenewalHangs: a watchdog lease released while
// its renewal hangs on a paused server must still return by the caller's
// deadline. Release stops the watchdog first; with ContextTimeoutEnabled
// the renewal is a direct call that the watchdog's cancellation does not
// end (only the renewal's own deadline, the lease's, or ReadTimeout does),
// so Release must not wait for it beyond its own ctx.
func TestReleaseByDeadlineWhileRenewalHangs(t *testing.T) {
	t.Parallel() // own servers; mostly waits out deadlines, as TestHungRedisReturnsByDeadline
	for _, cte := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", cte), func(t *testing.T) {
			srv := redistest.Start(t)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: cte, ReadTimeout: 10 * time.Second})
			t.Cleanup(func() { _ = c.Close() })
			l := lockerWith(t, c, redislock.Options{WatchdogTTL: 6 * time.Second, ReplicaSync: redislock.ReplicaSync{Disabled: true}})
			lease := acquire(t, l, "lock:payment:1001") // renewed every 2 s
			srv.Signal(syscall.SIGSTOP)
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					srv.Signal(syscall.SIGCONT)
				}
			}
			t.Cleanup(resume)
			// The renewal is in flight once a connection is in use.
			waitFor(t, func() bool { s := c.PoolStats(); return s.TotalConns > s.IdleConns })
			within(t, "Release", func(ctx context.Context) error { return lease.Release(ctx) })
			resume()
			if err := lease.Release(ctx(t)); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("Release after the server resumed: %v", err)
			}
			if n := srv.Client(t).Exists(ctx(t), lockKey("lock:payment:1001")).Val(); n != 0 {
				t.Fatal("the lock is still held after Release")
			}
		})
	}
}
