package redislock

import (
	"context"
	"errors"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestCancelledAcquiresLeaveNoJoining: waiting Acquires cancelled at
// random moments (before, during or after their first try, while they
// subscribe, while they wait) leave nothing in Locker.joining, nor a
// subscription.
func TestCancelledAcquiresLeaveNoJoining(t *testing.T) {
	srv := redistest.Start(t)
	const name = "lock:join-cancel"
	holders, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := holders.Acquire(context.Background(), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(context.Background())
	c := srv.Client(t)
	c.AddHook(cancelHook{}) // a third of the Acquires are cancelled as their try is sent
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewSource(seed))
	var wg sync.WaitGroup
	for i := range 60 {
		d := time.Duration(rnd.Intn(3000)) * time.Microsecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			if i%3 == 0 {
				ctx = context.WithValue(ctx, cancelKey{}, cancel)
			}
			if ls, err := l.Acquire(ctx, name, fence.Wait(10*time.Second)); err == nil {
				_ = ls.Release(context.Background())
				t.Error("acquired a held lock")
			}
		}()
	}
	wg.Wait()
	l.mu.Lock()
	joining, subs := len(l.joining), len(l.subscriptions)
	l.mu.Unlock()
	if joining != 0 || subs != 0 {
		t.Fatalf("after 60 cancelled Acquires: %d owners in joining, %d subscriptions", joining, subs)
	}
}

type cancelKey struct{}

// cancelHook cancels the context a call carries under cancelKey before
// sending the call.
type cancelHook struct{}

func (cancelHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (cancelHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cancel, ok := ctx.Value(cancelKey{}).(context.CancelFunc); ok {
			cancel()
		}
		return next(ctx, cmd)
	}
}
func (cancelHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cancel, ok := ctx.Value(cancelKey{}).(context.CancelFunc); ok {
			cancel()
		}
		return next(ctx, cmds)
	}
}

// TestContendedLockersInOneProcess: two Lockers (their own clients) in one
// process, each with many concurrent Acquires on one lock, racing their
// first tries against the releases (grants to one Locker's owners reach
// the other's subscription). At most one holder at a time; each lease's
// lock is in Redis under its owner; tokens increase; no Acquire outlasts
// its budget by much; nothing is left in joining.
func TestContendedLockersInOneProcess(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:join-contend"
	var lockers [2]*Locker
	for i := range lockers {
		l, err := New(srv.Client(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		lockers[i] = l
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	var (
		mu      sync.Mutex
		holding int
		last    fence.Token
		got     int
	)
	lockKey := "fence:{" + name + "}"
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for g := range 16 {
		rnd := rand.New(rand.NewSource(seed + int64(g)))
		l := lockers[g%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				budget := time.Duration(50+rnd.Intn(400)) * time.Millisecond
				start := time.Now()
				ls, err := l.Acquire(context.Background(), name, fence.Wait(budget), fence.TTL(2*time.Second))
				if took := time.Since(start); took > budget+300*time.Millisecond {
					t.Errorf("Acquire with a %v budget took %v (%v)", budget, took, err)
				}
				if err != nil {
					if !errors.Is(err, fence.ErrHeld) {
						t.Errorf("Acquire: %v", err)
					}
					continue
				}
				mu.Lock()
				holding++
				if holding != 1 {
					t.Errorf("%d holders at once", holding)
				}
				if ls.Token() <= last {
					t.Errorf("token %d after %d", ls.Token(), last)
				}
				last = ls.Token()
				got++
				mu.Unlock()
				owner := ls.(*lease).attempt.owner
				if v := admin.Get(context.Background(), lockKey).Val(); !strings.Contains(v, owner) {
					t.Errorf("lease %d: the lock is %q, not its owner %s", ls.Token(), v, owner)
				}
				for range rnd.Intn(3) {
					_ = admin.Ping(context.Background()).Err() // some work
				}
				mu.Lock()
				holding--
				mu.Unlock()
				if err := ls.Release(context.Background()); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d leases", got)
	for i, l := range lockers {
		l.mu.Lock()
		n := len(l.joining)
		l.mu.Unlock()
		if n != 0 {
			t.Errorf("Locker %d: %d owners left in joining", i, n)
		}
	}
}
