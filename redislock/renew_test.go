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
// use the lock. The lock's expiry on the server is set 400 ms past the local
// deadline, as a pause that ends within the deadline's allowance would leave
// it, so that the lock is still there when the late renewal runs.
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
	serverExpiry := time.Until(lease.Deadline()) + 400*time.Millisecond
	if err := admin.PExpire(ctx(t), lockKey(name), serverExpiry).Err(); err != nil {
		t.Fatal(err)
	}
	gets := commandCalls(t, admin, "get")

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
	pttl := admin.PTTL(ctx(t), lockKey(name)).Val()
	t.Logf("Extend = %v; lock's TTL after the late renewal ran: %v", <-extended, pttl)
	if pttl > 400*time.Millisecond {
		t.Fatalf("the late renewal extended the lock to %v after the lease had ended; want it left to expire (<= 400ms)", pttl)
	}
	if err := lease.Release(ctx(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of the ended lease = %v, want ErrLeaseLost", err)
	}
}
