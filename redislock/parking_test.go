package redislock_test

import (
	"bytes"
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

// goroutinesBy counts the goroutines that fn started (a goroutine that has
// not run yet shows the go statement's wrapper as its function, but its
// "created by" line from the start).
func goroutinesBy(fn string) int {
	fn = "created by github.com/fencekit/fence/redislock." + fn + " in "
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte(fn))
		}
		buf = make([]byte, 2*len(buf))
	}
}

const parkingFn = "(*parking).park"

// giveBackFn starts the goroutine of each give-back sent in the background
// (the Acquire's giveUpMaybeHeld or withdrawal, counted for WaitGiveBacks).
const giveBackFn = "(*inflight).goRun"

// parkingIdle reports whether no parking goroutine runs: none probing
// (started by park), none handing out give-backs that a server answers
// again for, and none of those give-backs being sent.
// probing reports whether a parked give-back is being tried (see
// (*probe).try): the stack of a goroutine that has run shows its function.
func probing() bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Contains(buf[:n], []byte("redislock.(*probe).try("))
		}
		buf = make([]byte, 2*len(buf))
	}
}

func parkingIdle() bool {
	return goroutinesBy(parkingFn) == 0 && goroutinesBy("(*parking).unpark") == 0 && goroutinesBy("(*parking).send") == 0
}

// TestRefusedAcquiresParkWithOneGoroutine: while the server refuses
// connections, every failed Acquire on a client that resends may hide a
// copy that ran (TestRefusedRetryAfterLostReplyGivesBack), so it leaves a
// give-back; they wait in the Locker's parking, with one goroutine for all
// of them, not one each. Once the server answers, each is sent (its
// revocation mark written) and the goroutine ends.
func TestRefusedAcquiresParkWithOneGoroutine(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	lr := &lostReply{refuse: true}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: lr.dial, DialerRetries: 1, MaxRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const n = 40
	errs := make(chan error, n)
	for range n { // at once: the parking is shared
		go func() {
			_, err := l.Acquire(ctx(t), "lock:parked", fence.TTL(time.Minute))
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Acquire with every dial refused: %v", err)
		}
	}
	if got := redislock.Parked(l); got != n {
		t.Fatalf("%d give-backs parked after %d refused Acquires, want %d", got, n, n)
	}
	if got := goroutinesBy(parkingFn); got != 1 {
		t.Fatalf("%d parking goroutines, want 1", got)
	}
	if got := goroutinesBy(giveBackFn); got != 0 {
		t.Fatalf("%d give-backs retrying in goroutines of their own, want 0 (parked)", got)
	}
	if n := admin.Keys(ctx(t), "*").Val(); len(n) != 0 {
		t.Fatalf("keys written while every dial was refused: %v", n)
	}
	lr.set(func() { lr.refuse = false })
	waitFor(t, func() bool { return redislock.Parked(l) == 0 && parkingIdle() })
	// Each give-back ran: it left its owner's revocation mark.
	if marks := len(admin.Keys(ctx(t), lockKey("lock:parked")+":revoked:*").Val()); marks != n {
		t.Fatalf("%d revocation marks after the server answered again, want %d", marks, n)
	}
}

// TestParkedGiveBacksEnd: the parking's goroutine ends by itself when the
// locks its give-backs were for would have expired, the server still
// refusing; and when the client is closed, without waiting for that.
func TestParkedGiveBacksEnd(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name  string
		ttl   time.Duration
		close bool
	}{
		{"expired", time.Second, false},
		{"client closed", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lr := &lostReply{refuse: true}
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: lr.dial, DialerRetries: 1, MaxRetries: 1})
			t.Cleanup(func() { _ = c.Close() })
			l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
			if _, err := l.Acquire(ctx(t), "lock:parked-end", fence.TTL(tc.ttl)); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("Acquire with every dial refused: %v", err)
			}
			if redislock.Parked(l) != 1 {
				t.Fatal("the refused Acquire parked no give-back")
			}
			if tc.close {
				_ = c.Close()
			}
			waitFor(t, func() bool { return goroutinesBy(parkingFn) == 0 })
			if got := redislock.Parked(l); got != 0 {
				t.Fatalf("%d give-backs left parked", got)
			}
		})
	}
}
