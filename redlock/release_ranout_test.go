package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// TestReleaseOutlivedByItsLease: the replies to a Release are held until
// its requests time out (the node timeout, capped by the lease time), so
// that the lease's Deadline passes while the deletes are out, as a short
// lease's does on slow nodes. The lease is then over whatever the nodes
// answer: Release returns an error matching fence.ErrLeaseLost, not
// ErrNoQuorum (which says "call again"), Err says so, and the Observer
// hears LostExpired. Before, the conformance suite's Release of a MinTTL
// lease failed under load with "no quorum: released on 1 of 5 nodes, 3
// needed ... no reply in time within 7.9ms".
func TestReleaseOutlivedByItsLease(t *testing.T) {
	srvs := nodes(t, 3)
	_, relHash := redlock.ScriptHashes()
	hooks := make([]*loseReleaseReply, len(srvs))
	rhooks := make([]redis.Hook, len(srvs))
	for i := range srvs {
		hooks[i] = &loseReleaseReply{relHash: relHash}
		rhooks[i] = hooks[i]
	}
	rec := &recorder{}
	l, err := redlock.New(clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, rhooks...),
		&redlock.Options{NodeTimeout: 10 * time.Second, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	const name = "release-outlived"
	warmRelease(t, l, srvs, name, 10*time.Second)
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		h.armed.Store(true)
	}
	err = lease.Release(ctxFor(t))
	if !time.Now().After(lease.Deadline()) {
		t.Fatalf("Release returned %v before the lease's Deadline: the test did not hold its replies past it", err)
	}
	if !errors.Is(err, fence.ErrLeaseLost) || errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Release whose lease ran out while its deletes were out = %v; want ErrLeaseLost, not ErrNoQuorum", err)
	}
	if err2 := lease.Release(ctxFor(t)); err2 == nil || err2.Error() != err.Error() {
		t.Errorf("a second Release = %v, want the first's result again", err2)
	}
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Errorf("Err = %v, want ErrLeaseLost", lease.Err())
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var causes []fence.LeaseCause
	for _, e := range rec.ends {
		if e.Name == name {
			causes = append(causes, e.Cause)
		}
	}
	if len(causes) != 1 || causes[0] != fence.LostExpired {
		t.Errorf("ends of %q reported %v, want one LostExpired", name, causes)
	}
}

// loseReleaseReply, once armed, runs the release script but loses its
// reply: the call ends with its context, as with a node that does not
// answer.
type loseReleaseReply struct {
	relHash string
	armed   atomic.Bool
}

func (h *loseReleaseReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *loseReleaseReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *loseReleaseReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) < 2 || fmt.Sprint(a[1]) != h.relHash || !h.armed.Load() {
			return next(ctx, cmd)
		}
		_ = next(ctx, cmd)
		<-ctx.Done()
		cmd.SetErr(ctx.Err())
		return ctx.Err()
	}
}
