package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// readmeApprove is the README's "Use" snippet, pasted as it stands (only
// the "..." filled in and paymentService stubbed), so that it keeps
// compiling against the API it documents.
func readmeApprove(ctx context.Context, addr string, approve func(ctx context.Context, id int, token fence.Token) error) (kind string, err error) {
	client := redis.NewClient(&redis.Options{Addr: addr}) // or Sentinel, or Cluster
	defer client.Close()
	locker, err := redislock.New(client, nil)
	if err != nil {
		return "new", err
	}

	// Wait up to 2 s for the lock, hold it for at most 10 s.
	lease, err := locker.Acquire(ctx, "lock:payment:1001", fence.Wait(2*time.Second), fence.TTL(10*time.Second))
	if errors.Is(err, fence.ErrNotAcquired) {
		return "try again", fmt.Errorf("try again later: %w", err) // wraps fence.ErrHeld, ctx.Err(), fence.ErrNotReplicated or the Redis error
	}
	if err != nil {
		return "bad input", err // bad input, before anything was sent: fence.ErrInvalidName or fence.ErrInvalidOption
	}
	defer lease.Release(ctx)

	err = approve(lease.Context(), 1001, lease.Token()) // the token goes with the write
	return "approved", err
}

// TestREADMEUseSnippet checks the README's promises on the snippet: a free
// lock is approved with a token; a held one is "try again later" wrapping
// ErrHeld after about the 2 s budget; a dead server and a cancelled context
// are "try again later" too (never the "bad input" branch), within the
// caller's deadline.
func TestREADMEUseSnippet(t *testing.T) {
	srv := redistest.Start(t)
	var got fence.Token
	approve := func(ctx context.Context, id int, token fence.Token) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		got = token
		return nil
	}
	kind, err := readmeApprove(ctx(t), srv.Addr, approve)
	if kind != "approved" || err != nil || got <= 0 {
		t.Fatalf("free lock: %s, %v, token %d; want approved with a token > 0", kind, err, got)
	}

	// A lease time well past the 2 s wait: a 300 ms one whose renewals a
	// loaded machine delayed would free the lock and approve.
	holder := newLockerWith(t, srv.Client(t), redislock.Options{WatchdogTTL: 10 * time.Second})
	lease := acquire(t, holder, "lock:payment:1001")
	start := time.Now()
	kind, err = readmeApprove(ctx(t), srv.Addr, approve)
	took := time.Since(start)
	if kind != "try again" || !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("held lock: %s, %v; want try again wrapping ErrHeld", kind, err)
	}
	if took < 1900*time.Millisecond || took > 5*time.Second {
		t.Fatalf("held lock: gave up after %v, want about the 2 s wait budget", took)
	}
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	kind, err = readmeApprove(cctx, srv.Addr, approve)
	if kind != "try again" || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %s, %v; want try again wrapping context.Canceled", kind, err)
	}
	_ = lease.Release(ctx(t))

	srv.Kill()
	dctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start = time.Now()
	kind, err = readmeApprove(dctx, srv.Addr, approve)
	took = time.Since(start)
	if kind != "try again" {
		t.Fatalf("dead server: %s, %v; want try again (the README says only bad input takes the other branch)", kind, err)
	}
	if took > 3*time.Second {
		t.Fatalf("dead server: returned after %v with a 1 s deadline", took)
	}
}

// TestREADMEBadInput checks the README's list of bad input, each refused with
// a typed error that is not ErrNotAcquired (so the snippet's "bad input"
// branch takes it) and sends nothing: the cases TestBadInputSendsNothing
// leaves out (invalid UTF-8, characters that print as nothing, a TTL just
// under MinTTL), and the limits themselves accepted (a name of MaxNameLen
// bytes, a TTL of MinTTL).
func TestREADMEBadInput(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	var count counter
	c.AddHook(&count)
	l := newLocker(t, c)
	for what, tc := range map[string]struct {
		name string
		opts []fence.Option
		want error
	}{
		"invalid UTF-8":    {"lock:\xff", nil, fence.ErrInvalidName},
		"DEL byte":         {"lock:\x7f", nil, fence.ErrInvalidName},
		"byte order mark":  {"\ufefflock:payment:1001", nil, fence.ErrInvalidName},
		"zero-width space": {"lock:payment:1001\u200b", nil, fence.ErrInvalidName},
		"bidi override":    {"lock:\u202epayment", nil, fence.ErrInvalidName},
		"TTL under MinTTL": {"ok", []fence.Option{fence.TTL(fence.MinTTL - time.Millisecond)}, fence.ErrInvalidOption},
	} {
		_, err := l.Acquire(ctx(t), tc.name, tc.opts...)
		if !errors.Is(err, tc.want) || errors.Is(err, fence.ErrNotAcquired) {
			t.Errorf("%s: err = %v, want %v and not ErrNotAcquired", what, err, tc.want)
		}
	}
	if n := count.n.Load(); n != 0 {
		t.Fatalf("bad input sent %d commands", n)
	}
	lease := acquire(t, l, strings.Repeat("n", fence.MaxNameLen), fence.TTL(fence.MinTTL), fence.Wait(5*time.Second)) // a Wait: a take answered past 10 ms (a loaded machine) is given back and tried again
	if lease.Token() <= 0 {
		t.Fatalf("token %d", lease.Token())
	}
}

// TestReplicaSyncOptionErrorNamesTheField: a ReplicaSync out of range is
// refused with fence.ErrInvalidOption naming the field at fault and what it
// takes. Before, the error printed the whole struct ("redislock: replica
// sync {Disabled:false Acks:-5 Replicas:0 Timeout:0s _:{}}"), which left
// the user to guess which value was wrong and what would do.
func TestReplicaSyncOptionErrorNamesTheField(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	for _, tc := range []struct {
		sync redislock.ReplicaSync
		want string
	}{
		{redislock.ReplicaSync{Acks: -5}, "ReplicaSync.Acks -5: want a number of replicas (1 or more; 0 means 1), AcksMajority (-1) or AcksAll (-2)"},
		{redislock.ReplicaSync{Replicas: -1}, "ReplicaSync.Replicas -1: want 0"},
		{redislock.ReplicaSync{Timeout: -time.Second}, "ReplicaSync.Timeout -1s: want 0 (the default) or at least 1ms"},
		{redislock.ReplicaSync{Timeout: time.Microsecond}, "ReplicaSync.Timeout 1µs"},
	} {
		_, err := redislock.New(c, &redislock.Options{ReplicaSync: tc.sync})
		if !errors.Is(err, fence.ErrInvalidOption) || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %+v = %v; want ErrInvalidOption saying %q", tc.sync, err, tc.want)
		}
	}
	for _, ok := range []redislock.ReplicaSync{{Acks: redislock.AcksAll}, {Acks: redislock.AcksMajority}, {Acks: 3, Replicas: 3, Timeout: time.Millisecond}} {
		if _, err := redislock.New(c, &redislock.Options{ReplicaSync: ok}); err != nil {
			t.Errorf("New with %+v = %v; want it accepted", ok, err)
		}
	}
}

// TestReplicaSyncMoreAcksThanReplicasRefused: Acks above the Replicas
// given can never be met; New refuses it with fence.ErrInvalidOption, as
// fence exec refuses --acks 3 --replicas 2. Before, New accepted it and
// every Acquire waited out WAIT's timeout and failed with ErrNotReplicated
// ("0 of 3 required replicas acknowledged"), which a caller reads as "try
// again later", for ever.
func TestReplicaSyncMoreAcksThanReplicasRefused(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	_, err := redislock.New(c, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Acks: 3, Replicas: 2, Timeout: 50 * time.Millisecond}})
	if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), "Acks 3 is more than the 2") {
		t.Fatalf("New with Acks 3, Replicas 2 = %v; want ErrInvalidOption saying Acks is more than Replicas", err)
	}
	for _, ok := range []redislock.ReplicaSync{{Acks: 3}, {Acks: 2, Replicas: 2}, {Acks: 3, Replicas: 2, Disabled: true}} {
		if _, err := redislock.New(c, &redislock.Options{ReplicaSync: ok}); err != nil {
			t.Errorf("New with %+v = %v; want it accepted", ok, err)
		}
	}
}
