package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// commandCalls reads how many times Redis has run cmd, script calls included
// (INFO commandstats).
func commandCalls(t testing.TB, c *redis.Client, cmd string) int {
	t.Helper()
	info, err := c.Info(ctx(t), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest+",", ',')])
			return n
		}
	}
	return 0
}

// allCommandCalls reads how many commands Redis has run, script calls
// included (INFO commandstats).
func allCommandCalls(t testing.TB, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(ctx(t), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, line := range strings.Split(info, "\n") {
		if _, rest, ok := strings.Cut(line, ":calls="); ok && strings.HasPrefix(line, "cmdstat_") {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest+",", ',')])
			total += n
		}
	}
	return total
}

// TestLateRenewalDoesNotHoldTheLock: a renewal that sits in a paused
// server's socket until after the lease's deadline must not move the lock's
// expiry when the server resumes: its holder has given up, and nobody would
// use the lock. The lock's expiry on the server is set to 400 ms past the
// local deadline (PEXPIREAT: the server shares this machine's clock), as a
// pause that ends within the deadline's allowance would leave it, so that the
// lock is still there when the late renewal runs; the renewal must leave that
// expiry exactly where it was. (Comparing the expiry itself, not a PTTL with
// a bound, keeps the delay of the PEXPIREAT command out of the check.)
func TestLateRenewalDoesNotHoldTheLock(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr}) // go-redis defaults: 3 s read timeout
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	admin := srv.Client(t)
	const name = "lock:payment:1001"
	lease := acquire(t, l, name, fence.TTL(2*time.Second))
	if err := lease.Extend(ctx(t), time.Second); err != nil { // loads the script before the pause
		t.Fatal(err)
	}
	serverExpiry := lease.Deadline().Add(400 * time.Millisecond).Truncate(time.Millisecond)
	if err := admin.PExpireAt(ctx(t), lockKey(name), serverExpiry).Err(); err != nil {
		t.Fatal(err)
	}
	expiry := admin.PExpireTime(ctx(t), lockKey(name)).Val()
	if want := time.Duration(serverExpiry.UnixMilli()) * time.Millisecond; expiry != want {
		t.Fatalf("PEXPIRETIME after PEXPIREAT = %v, want %v", expiry, want)
	}
	gets := commandCalls(t, admin, "get")
	pexpires := commandCalls(t, admin, "pexpire")

	srv.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { srv.Signal(syscall.SIGCONT) })
	extended := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		extended <- lease.Extend(rctx, 30*time.Second)
	}()
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lease not ended at its deadline")
	}
	srv.Signal(syscall.SIGCONT)
	waitFor(t, func() bool { return commandCalls(t, admin, "get") > gets }) // the queued renewal ran
	after := admin.PExpireTime(ctx(t), lockKey(name)).Val()
	t.Logf("Extend = %v; lock's expiry after the late renewal ran: %d ms (was %d ms; -2: expired)", <-extended, after.Milliseconds(), expiry.Milliseconds())
	// -2: the lock is gone, expired where it should have or deleted by the
	// ended lease's own clean-up, which may run before or after the renewal.
	if after != expiry && after != -2 {
		t.Fatalf("the late renewal moved the lock's expiry by %v after the lease had ended; want it left to expire where it was", after-expiry)
	}
	if n := commandCalls(t, admin, "pexpire"); n != pexpires {
		t.Fatalf("the late renewal ran PEXPIRE (%d calls, was %d) after the lease had ended", n, pexpires)
	}
	if err := lease.Release(ctx(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of the ended lease = %v, want ErrLeaseLost", err)
	}
}

// TestStaleRenewalDoesNotShortenLock: an Extend with a short TTL is held up
// on its way (a slow link) until its caller gave up on it; a later Extend
// with a long TTL moves the lock and the lease's Deadline far ahead; then
// the old request reaches Redis. Run as a plain PEXPIRE it cut the lock's
// expiry to the short TTL while Deadline still lay ahead: another Locker
// took the lock inside the lease. The lock's expiry only ever moves later.
func TestStaleRenewalDoesNotShortenLock(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	// 1234 ms, as the stale renewal's lease ms argument, on its own line of
	// the request: nothing else sends it.
	h := redistest.NewHolder("\r\n1234\r\n")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: h.Dial})
	t.Cleanup(func() { _ = c.Close() })
	l := newLockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	lease, err := l.Acquire(ctx(t), "stale-renewal", fence.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	h.Arm()
	short, cancel := context.WithTimeout(ctx(t), 200*time.Millisecond)
	err = lease.Extend(short, 1234*time.Millisecond)
	cancel()
	if err == nil || h.Held() != 1 {
		t.Fatalf("the held renewal: Extend = %v with %d requests held; want a deadline error and 1", err, h.Held())
	}
	h.Disarm()
	if err := lease.Extend(ctx(t), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, admin, "evalsha")
	if err := h.Let(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for commandCalls(t, admin, "evalsha") == before {
		if time.Now().After(deadline) {
			t.Fatal("the held renewal did not reach Redis")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	pttl := admin.PTTL(ctx(t), lockKey("stale-renewal")).Val()
	if left := time.Until(lease.Deadline()); lease.Err() == nil && pttl < left {
		t.Fatalf("the stale renewal cut the lock's expiry to %v while the lease's Deadline is %v away: another Locker can take it inside the lease", pttl, left)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

// TestDuplicateAcquisitionDoesNotShortenLock: the lease's own acquisition
// run again after Extend moved the lock far ahead (go-redis's MaxRetries
// resends a request whose reply was lost, verbatim; a try can sit in a
// socket) takes the "already ours" path of the acquire script, whose
// PEXPIRE cut the expiry back to the acquisition's TTL while Deadline lay
// ahead. The expiry only moves later.
func TestDuplicateAcquisitionDoesNotShortenLock(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	rec := &recordArgs{key: lockKey("dup")}
	c.AddHook(rec)
	l := newLockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	lease, err := l.Acquire(ctx(t), "dup", fence.TTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	acquisition := rec.first()
	if acquisition == nil {
		t.Fatal("the acquisition's request was not seen")
	}
	if err := lease.Extend(ctx(t), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx(t), acquisition...).Err(); err != nil {
		t.Fatal(err)
	}
	pttl := admin.PTTL(ctx(t), lockKey("dup")).Val()
	if left := time.Until(lease.Deadline()); pttl < left {
		t.Fatalf("the duplicate acquisition cut the lock's expiry to %v while the lease's Deadline is %v away", pttl, left)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

// recordArgs is a go-redis hook that keeps the arguments of the commands,
// alone or in pipelines, that name key.
type recordArgs struct {
	key  string
	mu   sync.Mutex
	seen [][]any
}

func (r *recordArgs) first() []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seen) == 0 {
		return nil
	}
	return r.seen[0]
}

func (r *recordArgs) keep(cmd redis.Cmder) {
	args := cmd.Args()
	for _, a := range args {
		if a == r.key {
			r.mu.Lock()
			r.seen = append(r.seen, slices.Clone(args))
			r.mu.Unlock()
			return
		}
	}
}

func (r *recordArgs) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *recordArgs) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.keep(cmd)
		return next(ctx, cmd)
	}
}

func (r *recordArgs) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			r.keep(cmd)
		}
		return next(ctx, cmds)
	}
}

// TestUnmovedExpiryStillReplicated guards what replica sync rests on when
// an acquire or extend script writes nothing (GT left the expiry: the lock
// already runs longer), as a granted waiter's confirming try may: a WAIT
// after it must still count the replicas against everything written before
// it, a grant by another connection included. Redis sets a client's WAIT
// offset to the replication offset after every command it runs, read-only
// ones too (7.0); a server that set it only after commands that replicated
// something would answer such a WAIT at once, from a connection's older
// write that the paused replica has, and fail this test. Each script is the
// lease's own, replayed (as a resend would run it) after a longer Extend,
// on a connection whose last write the replica acknowledged, with WAIT 1
// after it. (On Redis 7.0 it passes even with scripts that write nothing;
// from 7.2 the offset moves only with a command that replicated something,
// which is why the scripts write the lock again when GT leaves it: see
// TestExpiryKeptIsReplicated.)
func TestUnmovedExpiryStillReplicated(t *testing.T) {
	t.Parallel() // own servers; mostly waits on WAITs
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	c := redis.NewClient(&redis.Options{Addr: primary.Addr})
	t.Cleanup(func() { _ = c.Close() })
	rec := &recordArgs{key: lockKey("unmoved")}
	c.AddHook(rec)
	l := newLockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: time.Second}})
	// Load the scripts, so that each call below is one EVALSHA.
	warm := acquire(t, l, "warm", fence.TTL(time.Minute))
	if err := warm.Extend(ctx(t), time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx(t), "unmoved", fence.TTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Extend(ctx(t), 3*time.Second); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	var scripts [][]any // the acquisition and the short renewal
	for _, args := range rec.seen {
		if s, _ := args[0].(string); strings.EqualFold(s, "evalsha") || strings.EqualFold(s, "eval") {
			scripts = append(scripts, args)
		}
	}
	rec.mu.Unlock()
	if len(scripts) != 2 {
		t.Fatalf("saw %d script calls on the lock, want the acquisition and the renewal", len(scripts))
	}
	if err := lease.Extend(ctx(t), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// Connections whose last write the replica has acknowledged, as a
	// waiter's is after its queued try.
	conns := make([]*redis.Conn, 2)
	for i := range conns {
		conns[i] = primary.Client(t).Conn()
		t.Cleanup(func() { _ = conns[i].Close() })
		if err := conns[i].Set(ctx(t), fmt.Sprintf("unmoved-other-%d", i), "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if n, err := conns[i].Do(ctx(t), "WAIT", 1, 5000).Int(); err != nil || n != 1 {
			t.Fatalf("WAIT before the pause = %d, %v", n, err)
		}
	}
	replica.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { replica.Signal(syscall.SIGCONT) })
	for i, what := range []string{"acquisition", "renewal"} {
		fresh := conns[i]
		var acked *redis.Cmd
		_, err := fresh.Pipelined(ctx(t), func(p redis.Pipeliner) error {
			p.Do(ctx(t), scripts[i]...)
			acked = p.Do(ctx(t), "WAIT", 1, 300)
			return nil
		})
		if err != nil {
			t.Fatalf("%s replayed: %v", what, err)
		}
		if n, _ := acked.Int(); n != 0 {
			t.Errorf("the %s, run again when it moved nothing, was confirmed by %d replica with the replica paused", what, n)
		}
	}
	replica.Signal(syscall.SIGCONT)
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}
