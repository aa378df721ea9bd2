package guard_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// notReplicatedSetup starts a primary with one replica and returns a
// Store with ClockTokens and Replicas 1 on a client of the primary, a
// fresh token, and the replica.
func notReplicatedSetup(t *testing.T, hooks ...redis.Hook) (*redistest.Server, *redistest.Server, redisstore.Store, fence.Token) {
	t.Helper()
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	c := primary.Client(t)
	for _, h := range hooks {
		c.AddHook(h)
	}
	store := clockStore(c)
	store.Replicas, store.ReplicaTimeout = 1, 200*time.Millisecond
	return primary, replica, store, primeFloor(t, store, c)
}

// refuse sends Accept of token with call while the replica is paused, and
// checks that it is refused not-replicated.
func refuse(t *testing.T, replica *redistest.Server, store redisstore.Store, call string, token fence.Token) error {
	t.Helper()
	resume := replica.Pause(t)
	err := store.Accept(guard.WithCall(ctx(t), call), "payment:1001", token)
	resume()
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("replica paused: %v, want ErrNotReplicated", err)
	}
	return err
}

// TestRedisStoreNotReplicatedFailover: a call refused for too few acks;
// the replica then receives the record late (it was only paused), and the
// primary fails over to it. The resend of the call on the promoted replica
// is refused not-replicated, not answered replayed (the call never ran)
// and not accepted (the token is spent there too): the mark went to the
// replica with the record.
func TestRedisStoreNotReplicatedFailover(t *testing.T) {
	primary, replica, store, t5 := notReplicatedSetup(t)
	refuse(t, replica, store, "call-1", t5)
	redistest.WaitReplicated(t, primary, 1)
	redistest.Failover(t, primary, replica)
	promoted := store
	promoted.Client, promoted.Replicas = replica.Client(t), 0
	err := promoted.Accept(guard.WithCall(ctx(t), "call-1"), "payment:1001", t5)
	if !errors.Is(err, fence.ErrNotReplicated) || errors.Is(err, guard.ErrReplayed) {
		t.Fatalf("resend on the promoted replica: %v, want ErrNotReplicated (refused before, never ran)", err)
	}
	if err := promoted.Accept(guard.WithCall(ctx(t), "call-2"), "payment:1001", t5); !errors.Is(err, guard.ErrStale) {
		t.Fatalf("another call with the spent token on the promoted replica: %v, want ErrStale", err)
	}
}

// failUnconfirm is a client hook that fails the script Accept sends to mark
// a refused call (EVALSHA or EVAL with 2 keys and 3 arguments), after
// running before, if set, once.
type failUnconfirm struct {
	before func()
	fail   bool
	once   sync.Once
}

func (h *failUnconfirm) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failUnconfirm) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failUnconfirm) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		if (name == "evalsha" || name == "eval") && len(cmd.Args()) == 8 {
			if h.before != nil {
				h.once.Do(h.before)
			}
			if h.fail {
				err := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("injected: connection reset")}
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// TestRedisStoreNotReplicatedMarkFails: the script that marks a refused
// call fails (a connection lost after WAIT): Accept still refuses
// not-replicated, saying the resend will be answered admitted, and the
// resend is: today's answer, false but safe (nothing runs).
func TestRedisStoreNotReplicatedMarkFails(t *testing.T) {
	_, replica, store, t5 := notReplicatedSetup(t, &failUnconfirm{fail: true})
	err := refuse(t, replica, store, "call-1", t5)
	if !strings.Contains(err.Error(), "answered as admitted") {
		t.Fatalf("refusal whose mark failed: %v, want it to say the resend is answered admitted", err)
	}
	if err := store.Accept(guard.WithCall(ctx(t), "call-1"), "payment:1001", t5); !errors.Is(err, guard.ErrReplayed) {
		t.Fatalf("resend after a failed mark: %v, want ErrReplayed (admitted: safe)", err)
	}
}

// TestRedisStoreNotReplicatedMarkOwnerChecked: between the refusal and its
// mark, another Accept recorded a newer token with its own call. The mark
// leaves that record alone: its call's resend is still found replayed, and
// the refused call's resend is stale (a newer token was accepted).
func TestRedisStoreNotReplicatedMarkOwnerChecked(t *testing.T) {
	hook := &failUnconfirm{}
	primary, replica, store, t5 := notReplicatedSetup(t, hook)
	other := store
	other.Client, other.Replicas = primary.Client(t), 0
	hook.before = func() {
		if err := other.Accept(guard.WithCall(context.Background(), "call-2"), "payment:1001", t5+1); err != nil {
			t.Errorf("the newer Accept before the mark: %v", err)
		}
	}
	refused := refuse(t, replica, store, "call-1", t5)
	if err := other.Accept(guard.WithCall(ctx(t), "call-2"), "payment:1001", t5+1); !errors.Is(err, guard.ErrReplayed) {
		t.Fatalf("resend of the newer call: %v, want ErrReplayed (the mark must not touch its record)", err)
	}
	if !strings.Contains(refused.Error(), "gone or replaced") {
		t.Fatalf("refusal whose record was replaced before the mark: %v", refused)
	}
	if err := store.Accept(guard.WithCall(ctx(t), "call-1"), "payment:1001", t5); !errors.Is(err, guard.ErrStale) {
		t.Fatalf("resend of the refused call after a newer token: %v, want ErrStale", err)
	}
}

// TestRedisStoreNotReplicatedWaitLateResend: WAIT's answer comes after the
// client's read timeout (a server run with hz 1: a second a tick; no
// retries), so Accept refuses with the WAIT's error (no count): the script
// had recorded the call. The replica then connects, and the call is resent: it never
// ran, so it must be refused again, not found replayed (Gate: 409
// admitted).
func TestRedisStoreNotReplicatedWaitLateResend(t *testing.T) {
	srv := redistest.Start(t, "--hz", "1")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	store := redisstore.Store{Client: c, Replicas: 1, ReplicaTimeout: 100 * time.Millisecond, Prefix: "guardtest:hz1resend"}
	first := store.Accept(guard.WithCall(ctx(t), "call-1"), "payment:1001", 5)
	if !errors.Is(first, fence.ErrNotReplicated) {
		t.Fatalf("no replica, hz 1: %v, want fence.ErrNotReplicated", first)
	}
	redistest.StartReplica(t, srv)
	redistest.WaitReplicated(t, srv, 1)
	err := store.Accept(guard.WithCall(ctx(t), "call-1"), "payment:1001", 5)
	if !errors.Is(err, fence.ErrNotReplicated) || errors.Is(err, guard.ErrReplayed) {
		t.Fatalf("resend of the refused call, replica connected: %v, want ErrNotReplicated (it never ran)", err)
	}
}

// TestRedisStoreAdmittedResendWaitFails: a call accepted and confirmed (it
// ran) is resent while its replica is paused, on a server whose WAIT
// answers after the client's read timeout: that resend is refused with
// WAIT's error, and its mark must not touch the record (it is the first
// Accept's): a later resend is still found replayed (the call ran), never
// told it did not run.
func TestRedisStoreAdmittedResendWaitFails(t *testing.T) {
	srv := redistest.Start(t, "--hz", "1")
	replica := redistest.StartReplica(t, srv)
	redistest.WaitReplicated(t, srv, 1)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	store := redisstore.Store{Client: c, Replicas: 1, ReplicaTimeout: 100 * time.Millisecond, Prefix: "guardtest:hz1admitted"}
	if err := store.Accept(guard.WithCall(ctx(t), "call-1"), "payment:1001", 5); err != nil {
		t.Fatalf("replica up: %v", err)
	}
	resume := replica.Pause(t)
	err := store.Accept(guard.WithCall(ctx(t), "call-1"), "payment:1001", 5)
	resume()
	if !errors.Is(err, guard.ErrReplayed) && !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("resend, replica paused: %v", err)
	}
	redistest.WaitReplicated(t, srv, 1)
	if err := store.Accept(guard.WithCall(ctx(t), "call-1"), "payment:1001", 5); !errors.Is(err, guard.ErrReplayed) {
		t.Fatalf("resend of the call that ran: %v, want ErrReplayed (it ran; it must never be told it did not)", err)
	}
}
