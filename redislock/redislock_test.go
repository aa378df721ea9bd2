package redislock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

const watchdogTTL = 300 * time.Millisecond

// conformanceWatchdogTTL is the conformance runs' watchdog lease (every
// deployment's): 1 s, not watchdogTTL's 300 ms, renewed every 100 ms, which CI's
// load starved (ci65: TestTLSConformance/WatchdogKeepsLease, "not renewed
// before its deadline"), as it had fencerueidis's and tests/pglock's
// before. The 300 ms only made the suite's waits (a few lease times each)
// shorter.
const conformanceWatchdogTTL = time.Second

func newLocker(t testing.TB, c redis.UniversalClient) *redislock.Locker {
	t.Helper()
	l, err := redislock.New(c, &redislock.Options{WatchdogTTL: watchdogTTL})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func lockKey(name string) string { return "fence:{" + name + "}" }

func TestConformance(t *testing.T) {
	t.Parallel() // own server; the suite mostly waits on leases and budgets (1 s slack)
	srv := redistest.Start(t)
	admin := srv.Client(t)
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New: func(t testing.TB) fence.Locker {
			return newLockerWith(t, srv.Client(t), redislock.Options{WatchdogTTL: conformanceWatchdogTTL})
		},
		Remove: func(t testing.TB, name string) { admin.Del(context.Background(), lockKey(name)) },
		NewObserved: func(t testing.TB, obs fence.Observer) fence.Locker {
			return newLockerWith(t, srv.Client(t), redislock.Options{Observer: obs, WatchdogTTL: conformanceWatchdogTTL})
		},
		NewLogged: func(t testing.TB, log *slog.Logger) fence.Locker {
			return newLockerWith(t, srv.Client(t), redislock.Options{Logger: log, WatchdogTTL: conformanceWatchdogTTL})
		},
		NewClosable: func(t testing.TB) (fence.Locker, func()) {
			c := srv.Client(t)
			return newLockerWith(t, c, redislock.Options{WatchdogTTL: conformanceWatchdogTTL}), func() { _ = c.Close() }
		},
		WatchdogTTL: conformanceWatchdogTTL,
	})
}

// newLockerWith is newLocker with options o, watchdogTTL when o has none.
func newLockerWith(t testing.TB, c redis.UniversalClient, o redislock.Options) *redislock.Locker {
	t.Helper()
	if o.WatchdogTTL == 0 {
		o.WatchdogTTL = watchdogTTL
	}
	l, err := redislock.New(c, &o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func acquire(t testing.TB, l *redislock.Locker, name string, opts ...fence.Option) fence.Lease {
	t.Helper()
	lease, err := l.Acquire(ctx(t), name, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", name, err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	return lease
}

func TestTokenIncreasesAfterRestartWithoutPersistence(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	l := newLocker(t, c)
	first := acquire(t, l, "lock:payment:1001", fence.TTL(time.Minute))
	srv.Restart(t) // save "" and no AOF: the lock and the token record are gone
	if n, err := c.Exists(ctx(t), lockKey("lock:payment:1001")).Result(); err != nil || n != 0 {
		t.Fatalf("after restart the lock key exists=%d err=%v; the test would not show counter loss", n, err)
	}
	second := acquire(t, l, "lock:payment:1001", fence.TTL(time.Minute))
	if second.Token() <= first.Token() {
		t.Fatalf("token after restart %d, want > %d", second.Token(), first.Token())
	}
}

func TestTokenIncreasesAfterRecordDeleted(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	l := newLocker(t, c)
	name := "lock:payment:1001"
	var last fence.Token
	for i := range 3 {
		lease := acquire(t, l, name, fence.TTL(time.Minute))
		if lease.Token() <= last {
			t.Fatalf("round %d: token %d, want > %d", i, lease.Token(), last)
		}
		last = lease.Token()
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if n := c.Del(ctx(t), lockKey(name)+":token").Val(); n != 1 {
			t.Fatalf("deleted %d token records, want 1", n)
		}
	}
}

func TestTokenIncreasesOnHandoff(t *testing.T) {
	srv := redistest.Start(t)
	a, b := newLocker(t, srv.Client(t)), newLocker(t, srv.Client(t))
	name := "lock:payment:1001"
	first := acquire(t, a, name, fence.TTL(time.Minute))
	got := make(chan fence.Lease, 1)
	go func() {
		lease, err := b.Acquire(ctx(t), name, fence.Wait(10*time.Second), fence.TTL(time.Minute))
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	if err := first.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	second := <-got
	if second == nil {
		t.FailNow()
	}
	defer second.Release(ctx(t))
	if second.Token() <= first.Token() {
		t.Fatalf("token after handoff %d, want > %d", second.Token(), first.Token())
	}
}

// counter counts the commands a client sends, pipelines included, except
// the handshake (HELLO, CLIENT SETINFO) that go-redis sends on each new
// connection.
type counter struct {
	n     atomic.Int64
	mu    sync.Mutex
	names map[string]int
}

func (c *counter) count(cmd redis.Cmder) {
	if name := cmd.Name(); name != "hello" && name != "client" {
		c.n.Add(1)
		c.mu.Lock()
		if c.names == nil {
			c.names = make(map[string]int)
		}
		c.names[name]++
		c.mu.Unlock()
	}
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.count(cmd); return next(ctx, cmd) }
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func TestBadInputSendsNothing(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	var count counter
	c.AddHook(&count)
	l := newLocker(t, c)
	cases := map[string]struct {
		name string
		opts []fence.Option
		want error
	}{
		"empty name":      {"", nil, fence.ErrInvalidName},
		"open brace":      {"lock:{1001", nil, fence.ErrInvalidName},
		"close brace":     {"lock:1001}", nil, fence.ErrInvalidName},
		"control byte":    {"lock:\x07", nil, fence.ErrInvalidName},
		"newline":         {"lock:\n", nil, fence.ErrInvalidName},
		"over-long name":  {strings.Repeat("n", fence.MaxNameLen+1), nil, fence.ErrInvalidName},
		"zero TTL":        {"ok", []fence.Option{fence.TTL(0)}, fence.ErrInvalidOption},
		"negative TTL":    {"ok", []fence.Option{fence.TTL(-time.Second)}, fence.ErrInvalidOption},
		"negative wait":   {"ok", []fence.Option{fence.Wait(-time.Millisecond)}, fence.ErrInvalidOption},
		"sub-ms TTL":      {"ok", []fence.Option{fence.TTL(time.Microsecond)}, fence.ErrInvalidOption},
		"1ms TTL":         {"ok", []fence.Option{fence.TTL(time.Millisecond)}, fence.ErrInvalidOption},
		"both bad values": {"", []fence.Option{fence.Wait(-1)}, fence.ErrInvalidName},
	}
	for what, tc := range cases {
		_, err := l.Acquire(ctx(t), tc.name, tc.opts...)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", what, err, tc.want)
		}
	}
	if n := count.n.Load(); n != 0 {
		t.Fatalf("bad input sent %d commands to Redis, want 0", n)
	}
	for _, prefix := range []string{"", "a{b"} {
		if prefix == "" {
			continue // empty means the default
		}
		if _, err := redislock.New(c, &redislock.Options{Prefix: prefix}); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("New with prefix %q = %v, want ErrInvalidOption", prefix, err)
		}
	}
	if _, err := redislock.New(nil, nil); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("New(nil) = %v, want ErrInvalidOption", err)
	}
	var nilClient *redis.Client
	var nilCluster *redis.ClusterClient
	for _, typedNil := range []redis.UniversalClient{nilClient, nilCluster} {
		if _, err := redislock.New(typedNil, nil); !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), "nil client") {
			t.Errorf("New(%T(nil)) = %v, want ErrInvalidOption saying the client is nil", typedNil, err)
		}
	}
	if _, err := redislock.New(c, &redislock.Options{WatchdogTTL: -time.Second}); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("New with negative watchdog TTL = %v, want ErrInvalidOption", err)
	}
}

func TestRedisDownErrorsWithinDeadline(t *testing.T) {
	srv := redistest.Start(t)
	addr := srv.Addr
	srv.Kill()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	l := newLocker(t, c)
	for _, wait := range []time.Duration{0, 10 * time.Second} {
		dctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		start := time.Now()
		_, err := l.Acquire(dctx, "lock:payment:1001", fence.Wait(wait))
		took := time.Since(start)
		cancel()
		if !errors.Is(err, fence.ErrNotAcquired) || errors.Is(err, fence.ErrHeld) {
			t.Fatalf("Acquire against a dead server = %v, want ErrNotAcquired with the connection error", err)
		}
		if took > 1500*time.Millisecond {
			t.Fatalf("Acquire against a dead server took %v with a 500ms deadline", took)
		}
	}
}

// TestWaiterSendsNothingWhileHeld: a waiter subscribes, tries, and then
// sends no command until the holder releases; the release wakes it at once.
func TestWaiterSendsNothingWhileHeld(t *testing.T) {
	srv := redistest.Start(t)
	holderClient, waiterClient := srv.Client(t), srv.Client(t)
	var holderCmds, waiterCmds counter
	holderClient.AddHook(&holderCmds)
	waiterClient.AddHook(&waiterCmds)
	// The holder's watchdog lease is 3 s, renewed every second: the
	// waiter's timer for the TTL it saw (3 s) must not run out while the
	// test watches, which a 300 ms lease did on a loaded machine (the
	// waiter then rightly tried again).
	holderLocker, err := redislock.New(holderClient, &redislock.Options{WatchdogTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	holder := acquire(t, holderLocker, "lock:payment:1001")
	waiter := newLocker(t, waiterClient)

	got := make(chan error, 1)
	go func() {
		lease, err := waiter.Acquire(ctx(t), "lock:payment:1001", fence.Wait(20*time.Second), fence.TTL(10*time.Second))
		if err == nil {
			err = lease.Release(ctx(t))
		}
		got <- err
	}()
	admin := srv.Client(t)
	// Three scripts: the read of the primary's replica count (replica
	// sync is on by default), the first try, and the try made once the
	// subscription is confirmed. Waiting for two let that last try, under
	// load, fall after the count and be taken for a command sent while
	// the lock was held.
	waitFor(t, func() bool {
		n := admin.PubSubNumSub(ctx(t), lockKey("lock:payment:1001")+":released").Val()
		return n[lockKey("lock:payment:1001")+":released"] == 1 && waiterCmds.n.Load() >= 3
	})
	before := waiterCmds.n.Load()
	renewals := holderCmds.n.Load()
	// The holder renews once (after 1 s, well under the waiter's 3 s timer).
	waitFor(t, func() bool { return holderCmds.n.Load() >= renewals+1 })
	if n := waiterCmds.n.Load(); n != before {
		t.Fatalf("waiter sent %d commands while the lock was held, want 0", n-before)
	}
	if before != 3 {
		t.Fatalf("waiter sent %d commands before waiting, want 3: the replica count, a try before and one after subscribing", before)
	}
	start := time.Now()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	// Without the message the waiter wakes by its timer, at least 1 s
	// after the release (its last try saw 2 s or more left, at most one
	// renewal period before): 750 ms leaves a loaded machine slack.
	if took := time.Since(start); took > 750*time.Millisecond {
		t.Fatalf("waiter took %v after the release; a wake-up by message takes milliseconds", took)
	}
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		<-tick.C
	}
}

func TestStatus(t *testing.T) {
	srv := redistest.Start(t)
	l := newLocker(t, srv.Client(t))
	s, err := l.Status(ctx(t), "lock:payment:1001")
	if err != nil || s.Held || s.LastToken != 0 {
		t.Fatalf("fresh Status = %+v, %v; want free, no token", s, err)
	}
	lease := acquire(t, l, "lock:payment:1001", fence.TTL(10*time.Second))
	s, err = l.Status(ctx(t), "lock:payment:1001")
	if err != nil || !s.Held || s.TTL <= 0 || s.TTL > 10*time.Second || s.LastToken != lease.Token() {
		t.Fatalf("held Status = %+v, %v; want held, TTL in (0, 10s], token %d", s, err, lease.Token())
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	s, err = l.Status(ctx(t), "lock:payment:1001")
	if err != nil || s.Held || s.LastToken != lease.Token() {
		t.Fatalf("released Status = %+v, %v; want free with last token %d", s, err, lease.Token())
	}
	if _, err := l.Status(ctx(t), "bad{name}"); !errors.Is(err, fence.ErrInvalidName) {
		t.Fatalf("Status(bad name) = %v", err)
	}
}
