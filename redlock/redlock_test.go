package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// nodes starts n independent redis-servers without persistence.
func nodes(t testing.TB, n int) []*redistest.Server {
	t.Helper()
	srvs := make([]*redistest.Server, n)
	for i := range srvs {
		srvs[i] = redistest.Start(t)
	}
	return srvs
}

// clients returns one client per server that honours the context's
// deadline on the socket and does not retry, closed in t.Cleanup.
func clients(t testing.TB, srvs []*redistest.Server) []redis.UniversalClient {
	return clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1})
}

// lateOptions make clients that leave a request to the per-node timeout
// (no deadline on the socket, a read timeout past it) and do not retry.
var lateOptions = redis.Options{ReadTimeout: 10 * time.Second, MaxRetries: -1}

// clientsWith returns one client per server, made from o with the server's
// address and closed in t.Cleanup; hooks[i], if given and not nil, is added
// to node i's client.
func clientsWith(t testing.TB, srvs []*redistest.Server, o redis.Options, hooks ...redis.Hook) []redis.UniversalClient {
	t.Helper()
	cs := make([]redis.UniversalClient, len(srvs))
	for i, s := range srvs {
		o.Addr = s.Addr
		c := redis.NewClient(&o)
		if i < len(hooks) && hooks[i] != nil {
			c.AddHook(hooks[i])
		}
		t.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	return cs
}

// generous is the node timeout of tests that are not about it: long enough
// for a round trip on a machine loaded by the whole test suite under -race
// (where a warm one can take over 50 ms), and capped by redlock at each
// lease's time less the drift allowance.
const generous = 2 * time.Second

// newLocker returns a Locker over srvs; nil opts give a watchdog TTL of
// 300 ms and the generous node timeout.
func newLocker(t testing.TB, srvs []*redistest.Server, opts *redlock.Options) *redlock.Locker {
	t.Helper()
	if opts == nil {
		opts = &redlock.Options{WatchdogTTL: 300 * time.Millisecond, NodeTimeout: generous}
	}
	l, err := redlock.New(clients(t, srvs), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return l
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// lockKey is the lock's key under the default prefix.
func lockKey(name string) string { return redlock.DefaultPrefix + ":{" + name + "}" }

// lockedOn lists the servers, among srvs, where name is locked.
func lockedOn(t testing.TB, srvs []*redistest.Server, name string) []int {
	t.Helper()
	var on []int
	for i, s := range srvs {
		n, err := s.Client(t).Exists(ctxFor(t), lockKey(name)).Result()
		if err != nil {
			t.Fatalf("EXISTS on node %d: %v", i, err)
		}
		if n == 1 {
			on = append(on, i)
		}
	}
	return on
}

func conformance(t *testing.T, n int) {
	srvs := nodes(t, n)
	build := func(t testing.TB, o redlock.Options) fence.Locker {
		o.WatchdogTTL, o.NodeTimeout = time.Second, generous
		l := newLocker(t, srvs, &o)
		// Warm up, as a long-lived Locker would be: the suite takes a
		// lease of fence.MinTTL (7.9 ms of validity) on a new Locker,
		// and a fresh Locker's first acquisition under -race (dials,
		// code paths run for the first time) takes 3 ms at the median
		// on this shared machine, 40 ms at worst; a warm one 0.6 ms.
		w, err := l.Acquire(ctxFor(t), "warm-up", fence.TTL(10*time.Second))
		if err != nil {
			t.Fatalf("warm-up Acquire: %v", err)
		}
		if err := w.Release(ctxFor(t)); err != nil {
			t.Fatalf("warm-up Release: %v", err)
		}
		return l
	}
	fencetest.Run(t, fencetest.Config{
		New:         func(t testing.TB) fence.Locker { return build(t, redlock.Options{}) },
		NewObserved: func(t testing.TB, obs fence.Observer) fence.Locker { return build(t, redlock.Options{Observer: obs}) },
		NewLogged:   func(t testing.TB, log *slog.Logger) fence.Locker { return build(t, redlock.Options{Logger: log}) },
		NewClosable: func(t testing.TB) (fence.Locker, func()) {
			cs := clients(t, srvs)
			l, err := redlock.New(cs, &redlock.Options{WatchdogTTL: time.Second, NodeTimeout: generous})
			if err != nil {
				t.Fatal(err)
			}
			return l, func() {
				for _, c := range cs {
					_ = c.Close()
				}
			}
		},
		// Long enough that a renewal every third of it reaches a majority
		// on a machine loaded by the whole test suite under -race.
		WatchdogTTL: time.Second,
		// Redlock times an acquisition against its lease time: a lease
		// of fence.MinTTL has 7.9 ms of validity, which a loaded
		// machine's round trips can use up (ErrValidity).
		ShortLeaseMayFail: true,
		Remove: func(t testing.TB, name string) {
			for _, s := range srvs {
				if err := s.Client(t).Del(ctxFor(t), lockKey(name)).Err(); err != nil {
					t.Fatalf("DEL: %v", err)
				}
			}
		},
	})
}

func TestConformance3(t *testing.T) { conformance(t, 3) }
func TestConformance5(t *testing.T) { conformance(t, 5) }

func TestNewRejectsBadClients(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	var typedNil *redis.Client
	for _, tc := range []struct {
		what    string
		clients []redis.UniversalClient
		opts    *redlock.Options
	}{
		{"no clients", nil, nil},
		{"nil client", []redis.UniversalClient{c, nil}, nil},
		{"typed nil client", []redis.UniversalClient{typedNil}, nil},
		{"the same client twice", []redis.UniversalClient{c, c}, nil},
		{"a prefix with braces", []redis.UniversalClient{c}, &redlock.Options{Prefix: "a{b}"}},
		{"a short watchdog TTL", []redis.UniversalClient{c}, &redlock.Options{WatchdogTTL: time.Millisecond}},
		{"a negative node timeout", []redis.UniversalClient{c}, &redlock.Options{NodeTimeout: -time.Second}},
		{"a negative retry delay", []redis.UniversalClient{c}, &redlock.Options{RetryDelay: -time.Second}},
	} {
		if _, err := redlock.New(tc.clients, tc.opts); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("New with %s = %v, want ErrInvalidOption", tc.what, err)
		}
	}
}

// Two clients to one server would count it twice: with a third, they would
// make a "majority" of one real node out of three. New refuses them.
func TestNewRejectsTwoClientsToOneServer(t *testing.T) {
	other := redis.NewClient(&redis.Options{Addr: "127.0.0.1:2"})
	defer other.Close()
	for _, same := range [][2]string{
		{"127.0.0.1:6399", "127.0.0.1:6399"},
		{"LocalHost:6399", "localhost:6399"},
		{":6399", "localhost:6399"},
		{"[::1]:6399", "[0:0::1]:6399"},
	} {
		a := redis.NewClient(&redis.Options{Addr: same[0]})
		b := redis.NewClient(&redis.Options{Addr: same[1], DB: 1})
		_, err := redlock.New([]redis.UniversalClient{a, other, b}, nil)
		var dup *redlock.DuplicateNodeError
		if !errors.Is(err, fence.ErrInvalidOption) || !errors.As(err, &dup) || dup.First != 0 || dup.Second != 2 {
			t.Errorf("New with clients to %s and %s = %v, want a *DuplicateNodeError for clients 0 and 2 matching ErrInvalidOption", same[0], same[1], err)
		}
		_ = a.Close()
		_ = b.Close()
	}
	a := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6399"})
	defer a.Close()
	b := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6398"})
	defer b.Close()
	if _, err := redlock.New([]redis.UniversalClient{a, b, other}, nil); err != nil {
		t.Errorf("New with three addresses: %v", err)
	}
}

// Two of five masters dead: the three left are a majority.
func TestTwoOfFiveDown(t *testing.T) {
	srvs := nodes(t, 5)
	l := newLocker(t, srvs, nil)
	srvs[1].Kill()
	srvs[3].Kill()
	var last fence.Token
	for i := range 3 {
		lease, err := l.Acquire(ctxFor(t), "two-down", fence.TTL(10*time.Second))
		if err != nil {
			t.Fatalf("Acquire %d with 2 of 5 nodes down: %v", i, err)
		}
		if lease.Token() <= last {
			t.Fatalf("token %d, want > %d", lease.Token(), last)
		}
		last = lease.Token()
		if got := lockedOn(t, []*redistest.Server{srvs[0], srvs[2], srvs[4]}, "two-down"); len(got) != 3 {
			t.Fatalf("locked on survivors %v, want all three", got)
		}
		if err := lease.Release(ctxFor(t)); err != nil {
			t.Fatalf("Release with 2 of 5 nodes down: %v", err)
		}
	}
}

// Three of five masters dead: no majority, and the survivors keep nothing.
func TestThreeOfFiveDown(t *testing.T) {
	srvs := nodes(t, 5)
	l := newLocker(t, srvs, nil)
	for _, i := range []int{0, 2, 4} {
		srvs[i].Kill()
	}
	survivors := []*redistest.Server{srvs[1], srvs[3]}
	const budget = 500 * time.Millisecond
	start := time.Now()
	_, err := l.Acquire(ctxFor(t), "three-down", fence.TTL(10*time.Second), fence.Wait(budget))
	took := time.Since(start)
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Acquire with 3 of 5 nodes down = %v, want ErrNotAcquired and ErrNoQuorum", err)
	}
	if took < budget || took > budget+time.Second {
		t.Fatalf("Acquire(wait %v) returned after %v", budget, took)
	}
	// A grant read after the last try was decided (the budget cut it) is
	// given back by the request that brought it, after Acquire returned:
	// the lock must be gone well before its 10 s lease time, not at once.
	waitUnlocked(t, survivors, "three-down", 3*time.Second)
	t.Logf("3 of 5 down: ErrNotAcquired after %v (budget %v): %v", took, budget, err)
}

// A node with a token record far ahead (a clock ahead, say) grants; then it
// restarts without persistence and comes back empty, with its clock right.
// The next lease's token must still be greater: the granting majority was
// told the token (the write-back), and every later majority meets it.
// Acquire decides as soon as a majority granted, so which nodes make the
// majority is pinned by keeping the third node down: node 0 while the
// node with the record ahead takes part, then node 1.
func TestTokenSurvivesRestartWithoutPersistence(t *testing.T) {
	srvs := nodes(t, 3)
	l := newLocker(t, srvs, nil)
	const name = "restart"
	ahead := time.Now().Add(time.Hour).UnixMicro()
	if err := srvs[2].Client(t).Set(ctxFor(t), lockKey(name)+":token", ahead, 0).Err(); err != nil {
		t.Fatal(err)
	}
	srvs[0].Kill()
	a, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("Acquire on nodes 1 and 2: %v", err)
	}
	if a.Token() <= fence.Token(ahead) {
		t.Fatalf("token %d, want > the node's record %d", a.Token(), ahead)
	}
	if err := a.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	srvs[2].Restart(t)
	b, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("Acquire after the restart: %v", err)
	}
	defer b.Release(ctxFor(t))
	if b.Token() <= a.Token() {
		t.Fatalf("token after the restart %d, want > %d", b.Token(), a.Token())
	}
	// And the same with the restarted node beside a node that comes back
	// empty, node 1 (told a's token) down.
	if err := b.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	srvs[0].Restart(t)
	srvs[1].Kill()
	c, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("Acquire on nodes 0 and 2: %v", err)
	}
	defer c.Release(ctxFor(t))
	if c.Token() <= b.Token() {
		t.Fatalf("token on nodes 0 and 2 %d, want > %d", c.Token(), b.Token())
	}
}

// A client paused between sending its requests and reading the replies,
// for longer than the lease time: by the time it could use the lock, the
// lease would have ended. The validity check must refuse it and release it
// everywhere. The clock is moved rather than waited for, so the nodes still
// hold the lock when the check runs.
func TestPauseBeforeRepliesFailsValidity(t *testing.T) {
	srvs := nodes(t, 3)
	l := newLocker(t, srvs, nil)
	const name, ttl = "paused", 10 * time.Second
	var skew atomic.Int64
	redlock.SetClock(l, func() time.Time { return time.Now().Add(time.Duration(skew.Load())) })
	var heldDuringPause []int
	redlock.SetBeforeReplies(l, func() {
		// Wait for the nodes to have run the scripts, then let the
		// lease time pass.
		deadline := time.Now().Add(5 * time.Second)
		for len(heldDuringPause) < len(srvs) && time.Now().Before(deadline) {
			heldDuringPause = lockedOn(t, srvs, name)
		}
		skew.Add(int64(ttl))
	})
	_, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, redlock.ErrValidity) {
		t.Fatalf("Acquire paused past its TTL = %v, want ErrNotAcquired and ErrValidity", err)
	}
	if len(heldDuringPause) != len(srvs) {
		t.Fatalf("during the pause the lock was held on nodes %v, want all", heldDuringPause)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("the refused acquisition left the lock on nodes %v", on)
	}
}

// A hung node (SIGSTOP) costs an acquisition nothing: it is decided once a
// majority granted, neither at the per-node timeout nor at the client's read
// timeout; the acquisition it never answered is revoked by Release, so it
// does not take the lock there when the node wakes up.
func TestHungNodeSkipped(t *testing.T) {
	srvs := nodes(t, 5)
	// Short next to the clients' read timeout, long enough for the
	// healthy nodes' round trips on a loaded machine.
	const nodeTimeout, readTimeout = time.Second, time.Minute
	// Clients that do not put the deadline on the socket: only the
	// per-node timeout bounds them, short of their read timeout.
	cs := clientsWith(t, srvs, redis.Options{ReadTimeout: readTimeout, MaxRetries: -1})
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: nodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	const name = "hung"
	// Warm up: the scripts loaded, connections in the pools.
	warm, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second) // Release returns at a majority
	// The warm-up's release may have revoked its acquisition on a node
	// whose grant had not come yet: only this test's marks count.
	if old, err := srvs[4].Client(t).Keys(ctxFor(t), lockKey(name)+":revoked:*").Result(); err != nil {
		t.Fatal(err)
	} else if len(old) > 0 {
		if err := srvs[4].Client(t).Del(ctxFor(t), old...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	before := scriptCalls(t, srvs[4])
	srvs[4].Signal(syscall.SIGSTOP)
	t.Cleanup(func() { srvs[4].Signal(syscall.SIGCONT) })
	start := time.Now()
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Acquire with one hung node: %v", err)
	}
	if took >= nodeTimeout {
		t.Fatalf("Acquire took %v with a node timeout of %v (read timeout %v); want the majority's replies alone", took, nodeTimeout, readTimeout)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release with one hung node: %v", err)
	}
	t.Logf("acquired in %v with one of five nodes hung (node timeout %v)", took, nodeTimeout)
	srvs[4].Signal(syscall.SIGCONT)
	// The hung node runs the acquisition and the release when it wakes,
	// in either order. Wait for both to have run there.
	deadline := time.Now().Add(10 * time.Second)
	for scriptCalls(t, srvs[4]) < before+2 {
		if time.Now().After(deadline) {
			t.Fatalf("the hung node ran %d scripts since it was stopped, want 2", scriptCalls(t, srvs[4])-before)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	// If the acquisition ran first, its grant, read once the node woke,
	// is also given back at once.
	waitUnlocked(t, srvs, name, 2*time.Second)
	// The release that the hung node did not answer left a revocation
	// mark, so that the acquisition refuses if it runs after it.
	marks, err := srvs[4].Client(t).Keys(ctxFor(t), lockKey(name)+":revoked:*").Result()
	if err != nil || len(marks) != 1 {
		t.Fatalf("revocation marks on the hung node: %v, %v; want one", marks, err)
	}
	// Everything answers again.
	b, err := l.Acquire(ctxFor(t), name, fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("Acquire after the node woke: %v", err)
	}
	if err := b.Release(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
}

// scriptCalls is how many scripts the server has run (EVALSHA and EVAL).
func scriptCalls(t testing.TB, s *redistest.Server) int {
	t.Helper()
	info, err := s.Client(t).Info(ctxFor(t), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO: %v", err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			var calls int
			if _, err := fmt.Sscanf(line[strings.Index(line, ":")+1:], "calls=%d", &calls); err != nil {
				t.Fatalf("INFO line %q: %v", line, err)
			}
			n += calls
		}
	}
	return n
}

// A wait budget long next to a try makes its budget's context only when a
// second try is needed: the budget must still bound the wait, and a
// waiter must still get the lock once it is released.
func TestLongWaitBudget(t *testing.T) {
	srvs := nodes(t, 3)
	const nodeTimeout = 100 * time.Millisecond
	// At least DefaultConnectTimeout plus four node timeouts: the first
	// try runs without the budget's context.
	const wait = redlock.DefaultConnectTimeout + 5*nodeTimeout
	l := newLocker(t, srvs, &redlock.Options{NodeTimeout: nodeTimeout, RetryDelay: 20 * time.Millisecond})
	held, err := l.Acquire(ctxFor(t), "budget", fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	start := time.Now()
	_, err = l.Acquire(ctxFor(t), "budget", fence.TTL(time.Minute), fence.Wait(wait))
	took := time.Since(start)
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire of a held lock = %v, want ErrNotAcquired and ErrHeld", err)
	}
	if took < wait || took > wait+2*time.Second {
		t.Fatalf("Acquire of a held lock gave up after %v, want its budget %v", took, wait)
	}
	// A waiter gets the lock once it is released.
	got := make(chan error, 1)
	go func() {
		ls, err := l.Acquire(ctxFor(t), "budget", fence.TTL(time.Minute), fence.Wait(wait))
		if err == nil {
			if ls.Token() <= held.Token() {
				err = fmt.Errorf("token %d after %d", ls.Token(), held.Token())
			}
			_ = ls.Release(ctxFor(t))
		}
		got <- err
	}()
	if err := held.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiting Acquire after the release: %v", err)
	}
}
