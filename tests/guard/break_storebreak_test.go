package guard_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRedisStoreWrongTypeKeys: a floor key or a record of the wrong type
// (a hash, a list: someone else's keys under the Prefix) gives an error
// that is neither nil nor ErrStale, leaves the key as it was, and records
// nothing.
func TestRedisStoreWrongTypeKeys(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer c.Close()
	for _, kind := range []string{"hash", "list"} {
		for _, which := range []string{"floor", "record"} {
			store := clockStore(c)
			key := store.Prefix + ":floor"
			if which == "record" {
				key = store.Prefix + ":{payment:1001}"
			}
			var err error
			if kind == "hash" {
				err = c.HSet(ctx(t), key, "f", "1").Err()
			} else {
				err = c.RPush(ctx(t), key, "1").Err()
			}
			if err != nil {
				t.Fatal(err)
			}
			err = store.Accept(ctx(t), "payment:1001", serverMicros(t, c)+fence.Token(time.Hour.Microseconds()))
			if err == nil || errors.Is(err, guard.ErrStale) {
				t.Errorf("%s %s: %v, want an error that is not ErrStale", kind, which, err)
			}
			if typ, _ := c.Type(ctx(t), key).Result(); typ != kind {
				t.Errorf("%s %s: now a %s", kind, which, typ)
			}
			if which == "floor" {
				if n, _ := c.Exists(ctx(t), store.Prefix+":{payment:1001}", store.Prefix+":{payment:1001}:call").Result(); n != 0 {
					t.Errorf("%s floor: %d keys recorded", kind, n)
				}
			} else if n, _ := c.Exists(ctx(t), store.Prefix+":floor", store.Prefix+":{payment:1001}:call").Result(); n != 0 {
				t.Errorf("%s record: %d keys recorded", kind, n)
			}
		}
	}
}

// TestRedisStoreFloorEdges: tokens at the floor, just above it, and at the
// ends of the int64 range.
func TestRedisStoreFloorEdges(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer c.Close()
	store := clockStore(c)
	primeFloor(t, store, c)
	floor, err := c.Get(ctx(t), store.Prefix+":floor").Int64()
	if err != nil {
		t.Fatal(err)
	}
	var lost *guard.StoreLostError
	if err := store.Accept(ctx(t), "a", fence.Token(floor)); !errors.As(err, &lost) || lost.Floor != fence.Token(floor) || !errors.Is(err, guard.ErrStale) {
		t.Fatalf("token = floor %d: %v, want a *guard.StoreLostError with the floor", floor, err)
	}
	if err := store.Accept(ctx(t), "a", fence.Token(floor-1)); !errors.Is(err, guard.ErrStoreLost) {
		t.Fatalf("token below the floor: %v, want ErrStoreLost", err)
	}
	if err := store.Accept(ctx(t), "a", fence.Token(floor+1)); err != nil {
		t.Fatalf("token = floor+1: %v, want accepted", err)
	}
	// Once a record exists the floor plays no part: floor+1 is stale,
	// floor+2 accepted.
	if err := store.Accept(ctx(t), "a", fence.Token(floor+1)); !errors.Is(err, guard.ErrStale) || errors.Is(err, guard.ErrStoreLost) {
		t.Fatalf("floor+1 again: %v, want a plain ErrStale", err)
	}
	// The top of the int64 range (compared as strings, exactly): with
	// MaxAhead off, which refuses it otherwise (TestRedisStoreForgedTokenBlocks).
	store.MaxAhead = -1
	if err := store.Accept(ctx(t), "a", 1<<63-1); err != nil {
		t.Fatalf("max int64: %v", err)
	}
	var stale *guard.StaleError
	if err := store.Accept(ctx(t), "a", 1<<63-2); !errors.As(err, &stale) || stale.Last != 1<<63-1 {
		t.Fatalf("max int64 - 1 after max int64: %v, want stale with Last = max int64", err)
	}
	for _, bad := range []fence.Token{0, -1, -1 << 63} {
		if err := store.Accept(ctx(t), "b", bad); !errors.Is(err, guard.ErrInvalidToken) {
			t.Errorf("token %d: %v, want ErrInvalidToken", bad, err)
		}
	}
	if n, _ := c.Exists(ctx(t), store.Prefix+":{b}").Result(); n != 0 {
		t.Fatal("an invalid token was recorded")
	}
}

// TestRedisStoreFloorRace: many goroutines race the floor's creation on
// a fresh store, half of them with a token issued before it, half after,
// over one resource and many: one floor, exactly one Accept of a given
// token on one resource, and no token issued before the floor accepted.
func TestRedisStoreFloorRace(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 32})
	defer c.Close()
	store := clockStore(c)
	before := serverMicros(t, c) - 1
	after := before + fence.Token(time.Hour.Microseconds())
	const n = 32
	var wg sync.WaitGroup
	errs := make([]error, 2*n)
	for i := range n {
		wg.Add(2)
		go func() { defer wg.Done(); errs[i] = store.Accept(ctx(t), "one", after) }()
		go func() {
			defer wg.Done()
			tok := before
			if i%2 == 1 {
				tok = after
			}
			errs[n+i] = store.Accept(ctx(t), "r"+strconv.Itoa(i), tok)
		}()
	}
	wg.Wait()
	accepted := 0
	for i, err := range errs[:n] {
		switch {
		case err == nil:
			accepted++
		case !errors.Is(err, guard.ErrStale) || errors.Is(err, guard.ErrStoreLost):
			t.Errorf("one, goroutine %d: %v, want plain ErrStale", i, err)
		}
	}
	if accepted != 1 {
		t.Errorf("token %d on one resource accepted %d times, want once", after, accepted)
	}
	for i, err := range errs[n:] {
		if i%2 == 1 && err != nil {
			t.Errorf("r%d, token after the floor: %v", i, err)
		}
		if i%2 == 0 && !errors.Is(err, guard.ErrStoreLost) {
			t.Errorf("r%d, token before the floor: %v, want ErrStoreLost", i, err)
		}
	}
}

// TestRedisStoreAOFAlwaysRestart: the documented durable set-up (an
// append-only file with appendfsync always), killed and restarted: the
// floor and records come back, so the stale token is a plain ErrStale
// (not StoreLost: nothing was lost), the next is accepted, and a new
// resource's fresh token is not refused.
func TestRedisStoreAOFAlwaysRestart(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	c := srv.Client(t)
	store := clockStore(c)
	t5 := primeFloor(t, store, c)
	acceptThenStale(t, store, t5, t5+2)
	srv.Restart(t)
	if err := store.Accept(ctx(t), "payment:1001", t5); !errors.Is(err, guard.ErrStale) || errors.Is(err, guard.ErrStoreLost) {
		t.Fatalf("stale token after a restart with AOF always: %v, want a plain ErrStale", err)
	}
	if err := store.Accept(ctx(t), "payment:1001", t5+3); err != nil {
		t.Fatalf("newer token after the restart: %v", err)
	}
	if err := store.Accept(ctx(t), "payment:2002", serverMicros(t, c)); err != nil {
		t.Fatalf("a new resource's fresh token after the restart: %v", err)
	}
}

// TestRedisStoreReplayAfterLoss: a resend of an admitted call (same call
// id, same token) is ErrReplayed; after the store lost its state it is
// refused by the floor (ErrStoreLost), never admitted again.
func TestRedisStoreReplayAfterLoss(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	store := clockStore(c)
	t5 := primeFloor(t, store, c)
	cctx := guard.WithCall(ctx(t), "call-1")
	if err := store.Accept(cctx, "payment:1001", t5); err != nil {
		t.Fatal(err)
	}
	if err := store.Accept(cctx, "payment:1001", t5); !errors.Is(err, guard.ErrReplayed) {
		t.Fatalf("resend: %v, want ErrReplayed", err)
	}
	if err := store.Accept(ctx(t), "payment:1001", t5); !errors.Is(err, guard.ErrStale) || errors.Is(err, guard.ErrReplayed) {
		t.Fatalf("same token, another call: %v, want ErrStale", err)
	}
	if err := c.FlushAll(ctx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := store.Accept(cctx, "payment:1001", t5); !errors.Is(err, guard.ErrStoreLost) {
		t.Fatalf("resend after FLUSHALL: %v, want ErrStoreLost", err)
	}
}

// TestGateRedisStoreNotReplicated: Gate over a real Store with Replicas:
// with the replica paused (SIGSTOP) the answer is 503 not-replicated
// within about ReplicaTimeout and the handler does not run; resumed, the
// next token is admitted.
func TestGateRedisStoreNotReplicated(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	c := primary.Client(t)
	store := clockStore(c)
	store.Replicas, store.ReplicaTimeout = 1, 200*time.Millisecond
	t5 := primeFloor(t, store, c)
	ran := 0
	h := guard.Gate(store, guard.HTTPOptions{Resource: oneResource, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
	hs := httptest.NewServer(h)
	defer hs.Close()
	resume := replica.Pause(t)
	start := time.Now()
	status, p, body := send(t, hs.Client(), hs.URL, guard.TokenHeader, strconv.FormatInt(int64(t5), 10))
	took := time.Since(start)
	resume()
	if status != http.StatusServiceUnavailable || p.Type != guard.ProblemNotReplicated || ran != 0 {
		t.Fatalf("replica paused: %d %q, handler ran %d times; want 503 %s, not run; body %s", status, p.Type, ran, guard.ProblemNotReplicated, body)
	}
	if took > 5*time.Second {
		t.Fatalf("refusal took %v for a ReplicaTimeout of 200ms", took)
	}
	redistest.WaitReplicated(t, primary, 1)
	if status, _, body := send(t, hs.Client(), hs.URL, guard.TokenHeader, strconv.FormatInt(int64(t5+1), 10)); status != http.StatusOK || ran != 1 {
		t.Fatalf("replica resumed: %d (ran %d), want 200; body %s", status, ran, body)
	}
}
