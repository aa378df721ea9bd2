package guard_test

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRedisStoreResentAcceptIsNotStale: the connection breaks after Redis
// ran Accept's script and before its reply arrives; go-redis, as it does
// by default, sends the script again. The resent script found the token
// it had just recorded and answered stale: a lone holder with the newest
// token was told that a newer one had been accepted (Gate answered 409),
// its work refused, its token spent. Accept must recognise its own resend
// and return nil; a second Accept of the same token (a replay) must still
// be stale.
func TestRedisStoreResentAcceptIsNotStale(t *testing.T) {
	prefix := "guardtest:resend:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	d := redistest.NewDropper("{payment:1001}")
	client := redis.NewClient(&redis.Options{Addr: redisAddr, Dialer: d.Dial}) // go-redis's default MaxRetries: 3
	t.Cleanup(func() { _ = client.Close() })
	s := redisstore.Store{Client: client, Prefix: prefix}

	// Load the script, so that the armed write is the EVALSHA that runs it.
	if err := s.Accept(ctx(t), "payment:1000", 1); err != nil {
		t.Fatal(err)
	}
	d.Arm()
	if err := s.Accept(ctx(t), "payment:1001", 5); err != nil {
		t.Errorf("Accept(5), its first reply lost and the script resent = %v; want nil (no other token was ever sent)", err)
	}
	if n := d.Dropped(); n != 1 {
		t.Fatalf("%d replies dropped; want 1", n)
	}
	var stale *guard.StaleError
	if err := s.Accept(ctx(t), "payment:1001", 5); !errors.As(err, &stale) || stale.Last != 5 {
		t.Errorf("Accept(5) again = %v; want a *StaleError with Last 5 (one Accept per token)", err)
	}
	if err := s.Accept(ctx(t), "payment:1001", 4); !errors.As(err, &stale) || stale.Last != 5 {
		t.Errorf("Accept(4) = %v; want a *StaleError with Last 5", err)
	}
	if err := s.Accept(ctx(t), "payment:1001", 6); err != nil {
		t.Errorf("Accept(6) = %v; want nil", err)
	}
}

// TestRedisStoreResendsUnderConcurrency: callers with tokens from one
// counter race on one resource while replies are lost and go-redis resends
// the script. Whatever the interleaving: an accepted token is never
// accepted after a greater one was (no accepted call began after a call
// with a greater accepted token had returned), the stored token is the
// greatest accepted one, and a caller alone in time with the greatest
// token so far is never told stale.
func TestRedisStoreResendsUnderConcurrency(t *testing.T) {
	prefix := "guardtest:resend-stress:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	d := redistest.NewDropper("{payment:stress}")
	client := redis.NewClient(&redis.Options{Addr: redisAddr, Dialer: d.Dial, PoolSize: 8})
	t.Cleanup(func() { _ = client.Close() })
	s := redisstore.Store{Client: client, Prefix: prefix}
	if err := s.Accept(ctx(t), "payment:warm", 1); err != nil { // load the script
		t.Fatal(err)
	}
	type call struct {
		token      int64
		start, end time.Time
		ok         bool
	}
	var (
		next  atomic.Int64
		mu    sync.Mutex
		calls []call
		wg    sync.WaitGroup
	)
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range 40 {
				if r.IntN(3) == 0 {
					d.Arm()
				}
				c := call{token: next.Add(1), start: time.Now()}
				err := s.Accept(ctx(t), "payment:stress", fence.Token(c.token))
				c.end = time.Now()
				if err != nil && !errors.Is(err, guard.ErrStale) {
					t.Errorf("Accept(%d): %v", c.token, err)
				}
				c.ok = err == nil
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if d.Dropped() == 0 {
		t.Fatal("no reply dropped: the test did not test resends")
	}
	var greatest int64
	for _, a := range calls {
		if !a.ok {
			continue
		}
		greatest = max(greatest, a.token)
		for _, b := range calls {
			if b.ok && a.token < b.token && a.start.After(b.end) {
				t.Errorf("token %d accepted, its call begun after token %d's accepted call returned", a.token, b.token)
			}
		}
	}
	stored, err := client.Get(ctx(t), prefix+":{payment:stress}").Int64()
	if err != nil || stored != greatest {
		t.Errorf("stored token %d (%v); want %d, the greatest accepted", stored, err, greatest)
	}
	// Alone now: each call's token is the greatest so far, its reply lost
	// every time; each must be accepted.
	for i := range 5 {
		d.Arm()
		tok := next.Add(1)
		if err := s.Accept(ctx(t), "payment:stress", fence.Token(tok)); err != nil {
			t.Errorf("lone Accept(%d) #%d, reply lost: %v", tok, i, err)
		}
	}
	t.Logf("%d calls, %d replies dropped", len(calls), d.Dropped())
}
