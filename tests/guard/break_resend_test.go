package guard_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

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
