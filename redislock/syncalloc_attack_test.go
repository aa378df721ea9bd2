package redislock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// taggedClient is a caller's own UniversalClient, passed by value: a
// *redis.Client with a map beside it, which makes the type uncomparable.
type taggedClient struct {
	*redis.Client
	tags map[string]string
}

// TestCustomClientByValue: New accepts any UniversalClient. One passed by
// value whose type cannot be compared (it holds a map) must work with
// replica sync as it does without: no panic comparing it with a node's
// client when choosing a pipeline.
func TestCustomClientByValue(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	for _, sync := range []bool{false, true} {
		l := lockerWith(t, taggedClient{primary.Client(t), map[string]string{"team": "payments"}},
			redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: !sync}})
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("sync=%v: Acquire panicked: %v", sync, p)
				}
			}()
			lease, err := l.Acquire(ctx(t), "by-value", fence.TTL(time.Minute))
			if err != nil {
				t.Fatalf("sync=%v: Acquire: %v", sync, err)
			}
			if err := lease.Release(ctx(t)); err != nil {
				t.Fatalf("sync=%v: Release: %v", sync, err)
			}
		}()
	}
}

// switchingClient is a caller's UniversalClient that moves to another
// server (a manual failover, a new address after a credentials rotation)
// by swapping the *redis.Client it sends through. It forwards what fence
// uses: the script commands and Pipeline.
type switchingClient struct {
	*redis.Client // the first one: the methods fence does not use
	cur           atomic.Pointer[redis.Client]
}

func (s *switchingClient) Pipeline() redis.Pipeliner { return s.cur.Load().Pipeline() }
func (s *switchingClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return s.cur.Load().Eval(ctx, script, keys, args...)
}
func (s *switchingClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return s.cur.Load().EvalSha(ctx, sha, keys, args...)
}

// TestSwitchingClient: a Locker on a client that switched servers must
// send every command, the replica-synced acquisition's pipeline included,
// to the server the client sends to now. Else the lock is written on the
// old server, where no Locker of the new one sees it: two holders.
func TestSwitchingClient(t *testing.T) {
	oldSrv, newSrv := redistest.Start(t), redistest.Start(t)
	redistest.StartReplica(t, oldSrv)
	redistest.StartReplica(t, newSrv)
	redistest.WaitReplicated(t, oldSrv, 1)
	redistest.WaitReplicated(t, newSrv, 1)
	sc := &switchingClient{Client: oldSrv.Client(t)}
	sc.cur.Store(sc.Client)
	l := lockerWith(t, sc, redislock.Options{})
	// Busy before the switch: acquisitions in parallel.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			lease, err := l.Acquire(ctx(t), fmt.Sprintf("before-switch-%d", i), fence.TTL(time.Minute))
			if err != nil {
				t.Error(err)
				return
			}
			_ = lease.Release(ctx(t))
		})
	}
	wg.Wait()

	sc.cur.Store(newSrv.Client(t))
	other := lockerWith(t, newSrv.Client(t), redislock.Options{})
	for i := range 16 {
		name := fmt.Sprintf("after-switch-%d", i)
		lease := acquire(t, l, name, fence.TTL(time.Minute))
		if n := oldSrv.Client(t).Exists(ctx(t), lockKey(name)).Val(); n != 0 {
			t.Errorf("%s: the lock was written on the server the client left", name)
		}
		if second, err := other.Acquire(ctx(t), name, fence.TTL(time.Minute)); err == nil {
			_ = second.Release(ctx(t))
			t.Fatalf("a Locker on the new server took %q while it was held: two holders (tokens %d and %d)", name, lease.Token(), second.Token())
		}
		_ = lease.Release(ctx(t))
	}
}

// redactingHook scrubs the arguments of every command after it ran, in
// place, before handing them to a log: a careless hook, but nothing in
// go-redis forbids it, and a command's arguments are its own.
type redactingHook struct{ logged atomic.Int64 }

func (h *redactingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *redactingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.redact(cmd)
		return err
	}
}
func (h *redactingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.redact(cmd)
		}
		return err
	}
}
func (h *redactingHook) redact(cmd redis.Cmder) {
	args := cmd.Args()
	for i := 1; i < len(args); i++ {
		args[i] = "?"
	}
	h.logged.Add(1)
}

// TestHookRewritesArgs: a hook that rewrites a command's arguments after it
// ran (added after New, as a service adds its logging later) must not
// change the commands of the next acquisitions: each command's arguments
// are its own, WAIT's included.
func TestHookRewritesArgs(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	c := primary.Client(t)
	l := lockerWith(t, c, redislock.Options{})
	var h redactingHook
	c.AddHook(&h)
	for i := range 3 {
		lease, err := l.Acquire(ctx(t), "redacted", fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("acquisition %d after a hook redacted the last one's commands: %v", i, err)
		}
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	if h.logged.Load() == 0 {
		t.Fatal("the hook saw no command")
	}
}
