package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// failedCalls counts the commands and pipelines of a client that failed
// after go-redis's own retries (which span about 1.7 s against a closed
// port with the default options), that is, the failures fence saw.
type failedCalls struct{ n atomic.Int64 }

func (f *failedCalls) count(err error, cmds ...redis.Cmder) {
	if err == nil || errors.Is(err, redis.Nil) || redis.HasErrorPrefix(err, "NOSCRIPT") {
		return
	}
	for _, cmd := range cmds {
		if cmd.Name() == "evalsha" || cmd.Name() == "eval" {
			f.n.Add(1) // a try failed (not the connection handshake)
			return
		}
	}
}

func (f *failedCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failedCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		f.count(err, cmd)
		return err
	}
}
func (f *failedCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		f.count(err, cmds...)
		return err
	}
}

// waitAll starts n goroutines that each wait up to budget for name, take
// it, and release it, and returns a function that collects their tokens and
// errors.
func waitAll(t *testing.T, l *redislock.Locker, name string, n int, budget time.Duration) func() ([]fence.Token, []error) {
	t.Helper()
	var wg sync.WaitGroup
	tokens := make([]fence.Token, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			lease, err := l.Acquire(ctx(t), name, fence.Wait(budget), fence.TTL(time.Minute))
			if err != nil {
				errs[i] = err
				return
			}
			tokens[i] = lease.Token()
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			errs[i] = lease.Release(rctx)
		})
	}
	return func() ([]fence.Token, []error) { wg.Wait(); return tokens, errs }
}

// subscribed waits until the lock's release channel has a subscriber on
// srv.
func subscribed(t *testing.T, c *redis.Client, name string) {
	t.Helper()
	ch := lockKey(name) + ":released"
	waitFor(t, func() bool { return c.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1 })
}

func checkAcquired(t *testing.T, tokens []fence.Token, errs []error, after fence.Token) {
	t.Helper()
	seen := map[fence.Token]bool{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("waiter %d: %v", i, err)
			continue
		}
		if tokens[i] <= after || seen[tokens[i]] {
			t.Errorf("waiter %d: token %d, want > %d and unique", i, tokens[i], after)
		}
		seen[tokens[i]] = true
	}
}

// TestWaitRidesOutRestart: a server killed and restarted on the same port
// while two callers wait does not end their waits: they retry with back-off
// and take the lock once the server is back (empty: no persistence), with
// tokens larger than the holder's (the clock floor). The server stays down
// until three tries have failed, so at least one caller saw two failures:
// longer than go-redis's own retries ride out.
func TestWaitRidesOutRestart(t *testing.T) {
	t.Parallel() // own server; mostly waits out the restart
	srv := redistest.Start(t)
	const name = "lock:payment:1001"
	holder := acquire(t, newLocker(t, srv.Client(t)), name, fence.TTL(time.Minute))
	c := srv.Client(t)
	var failed failedCalls
	c.AddHook(&failed)
	l := newLocker(t, c)
	collect := waitAll(t, l, name, 2, 20*time.Second)
	subscribed(t, srv.Client(t), name)

	srv.Kill()
	waitFor(t, func() bool { return failed.n.Load() >= 3 })
	if err := srv.Relaunch(); err != nil {
		t.Fatal(err)
	}
	tokens, errs := collect()
	t.Logf("failed tries while down: %d; tokens %v", failed.n.Load(), tokens)
	checkAcquired(t, tokens, errs, holder.Token())
}

// TestPermanentErrorEndsWait: an error that waiting cannot cure (the token
// record is a hash: WRONGTYPE) ends a 10 s wait at once.
func TestPermanentErrorEndsWait(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	const name = "lock:payment:1001"
	if err := c.HSet(ctx(t), lockKey(name)+":token", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := newLocker(t, c).Acquire(ctx(t), name, fence.Wait(10*time.Second))
	if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Acquire = %v, want ErrNotAcquired with WRONGTYPE", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a permanent error took %v to end the wait", took)
	}
}

// TestWaitRidesOutSentinelFailover: four callers wait (20 s budgets) on a
// lock whose primary dies; until Sentinel promotes a replica their tries
// fail (connection refused at the old address), and they keep trying. All
// four take the lock on the new primary once the holder's lease there runs
// out, with tokens larger than the holder's. The sentinels hold off the
// failover (down-after-milliseconds 60 s) until five tries have failed, so
// that at least one caller saw two failures: go-redis's own retries (about
// 1.7 s) would ride out a quick failover without fence's help.
func TestWaitRidesOutSentinelFailover(t *testing.T) {
	t.Parallel() // own primary, replicas and sentinels; mostly waits out the failover
	primary := redistest.Start(t)
	r1, r2 := redistest.StartReplica(t, primary), redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 2)
	sentinels := redistest.StartSentinels(t, primary, 3)
	redistest.WaitSentinelsReady(t, sentinels, 2)
	newClient := func() *redis.Client {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinels.Master, SentinelAddrs: sentinels.Addrs()})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	const name = "lock:payment:1001"
	setDownAfter := func(ms string) {
		for _, addr := range sentinels.Addrs() {
			sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
			err := sc.Set(ctx(t), sentinels.Master, "down-after-milliseconds", ms).Err()
			_ = sc.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// The holder's lease outlasts the failover (about 6 s here), so the
	// waiters are still waiting when the new primary takes over.
	holder, err := lockerWith(t, newClient(), redislock.Options{}).Acquire(ctx(t), name, fence.TTL(12*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c := newClient()
	var failed failedCalls
	c.AddHook(&failed)
	collect := waitAll(t, lockerWith(t, c, redislock.Options{}), name, 4, 20*time.Second)
	subscribed(t, primary.Client(t), name)

	setDownAfter("60000")
	start := time.Now()
	primary.Kill()
	waitFor(t, func() bool { return failed.n.Load() >= 5 })
	t.Logf("%d failed tries in %v; letting the sentinels fail over", failed.n.Load(), time.Since(start).Round(time.Millisecond))
	setDownAfter("1000")
	promoted := redistest.WaitFailover(t, sentinels, primary, r1, r2)
	t.Logf("sentinel promoted %s after %v", promoted.Addr, time.Since(start).Round(time.Millisecond))
	tokens, errs := collect()
	t.Logf("all waiters done %v after the kill; tokens %v", time.Since(start).Round(time.Millisecond), tokens)
	checkAcquired(t, tokens, errs, holder.Token())
	last, err := promoted.Client(t).Get(ctx(t), lockKey(name)+":token").Int64()
	if err != nil || fence.Token(last) < max(tokens[0], tokens[1], tokens[2], tokens[3]) {
		t.Fatalf("the promoted primary's token record is %d (%v); the waiters' tokens %v were not issued there", last, err, tokens)
	}
}

// TestACLErrorEndsWait: an ACL refusal (NOPERM: the user may not touch
// fence's keys) cannot pass by itself either; it ends a 10 s wait at once.
func TestACLErrorEndsWait(t *testing.T) {
	srv := redistest.Start(t)
	if err := srv.Client(t).Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~other:*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	start := time.Now()
	_, err := newLocker(t, c).Acquire(ctx(t), "lock:payment:1001", fence.Wait(10*time.Second))
	if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Acquire = %v, want ErrNotAcquired with NOPERM", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("an ACL error took %v to end the wait", took)
	}
}

// TestAuthErrorEndsWait: the README says auth errors end a wait at once, as
// WRONGTYPE and ACL errors do; no test had shown it. A wrong password
// (WRONGPASS) and no password where one is needed (NOAUTH) come back on
// every try until an operator changes the client or the server, so a 10 s
// wait must not spend its budget retrying them.
func TestAuthErrorEndsWait(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	if err := admin.Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	wrong := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "not-pw"})
	t.Cleanup(func() { _ = wrong.Close() })
	// The default user turned off: a client without credentials is refused
	// every command with NOAUTH (admin's connection, already in, stays).
	if err := admin.Do(ctx(t), "ACL", "SETUSER", "default", "off").Err(); err != nil {
		t.Fatal(err)
	}
	none := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = none.Close() })
	for what, c := range map[string]*redis.Client{"WRONGPASS": wrong, "NOAUTH": none} {
		start := time.Now()
		_, err := newLocker(t, c).Acquire(ctx(t), "lock:payment:1001", fence.Wait(10*time.Second))
		if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), what) {
			t.Fatalf("Acquire = %v, want ErrNotAcquired with %s", err, what)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("%s took %v to end the wait", what, took)
		}
	}
}

// TestWaitDeniedGivesLockBack: a user whose ACL allows the scripts but not
// WAIT, with replica sync on. The acquire script takes the lock, then WAIT
// fails (NOPERM): Acquire fails, and the lock it took, which nobody holds,
// must be given back, not left for the lease time (a minute here), with a
// wait budget and without.
func TestWaitDeniedGivesLockBack(t *testing.T) {
	srv := redistest.Start(t)
	if err := srv.Client(t).Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-wait").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	l, err := redislock.New(c, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	admin := srv.Client(t)
	for _, wait := range []time.Duration{0, 5 * time.Second} {
		name := fmt.Sprintf("lock:wait-denied:%v", wait)
		_, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute), fence.Wait(wait))
		if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "NOPERM") {
			t.Fatalf("Acquire (wait %v) = %v, want ErrNotAcquired with NOPERM", wait, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for admin.Exists(ctx(t), lockKey(name)).Val() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("wait %v: the lock taken before WAIT failed is still held (PTTL %v)", wait, admin.PTTL(ctx(t), lockKey(name)).Val())
			}
			time.Sleep(10 * time.Millisecond) // polling with a deadline
		}
	}
}
