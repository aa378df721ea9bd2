package redislock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
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
