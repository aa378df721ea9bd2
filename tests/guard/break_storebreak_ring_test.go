package guard_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/redis/go-redis/v9"
)

type tracedRing struct{ *redis.Ring }

type tracedUniversal struct{ redis.UniversalClient }

// TestRedisStoreWrappedRingOrCluster: Store refuses a *redis.Ring (a shard
// marked down moves the resource to a shard without its record:
// TestRedisStoreOnRingShardDown) and ClockTokens on a *redis.ClusterClient
// (the floor is in another slot), but checked only the client's own type:
// a tracing wrapper embedding the Ring (or a redis.UniversalClient holding
// it) was let through and the token recorded (nil), and a wrapped cluster
// client with ClockTokens reached Redis and failed with its raw error, not
// fence.ErrInvalidOption.
func TestRedisStoreWrappedRingOrCluster(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": redisAddr}})
	defer ring.Close()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{redisAddr}})
	defer cc.Close()
	c := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer c.Close()
	prefix := "guardtest:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for name, s := range map[string]redisstore.Store{
		"wrapped Ring":                    {Client: tracedRing{ring}},
		"Ring in a UniversalClient":       {Client: tracedUniversal{ring}},
		"wrapped wrapped Ring":            {Client: &tracedUniversal{tracedRing{ring}}},
		"wrapped cluster, ClockTokens":    {Client: tracedCluster{cc}, ClockTokens: true},
		"cluster in a UniversalClient CT": {Client: tracedUniversal{cc}, ClockTokens: true},
	} {
		s.Prefix = prefix
		if err := s.Accept(ctx(t), "payment:1001", 5); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("%s: %v, want fence.ErrInvalidOption", name, err)
		}
	}
	if n, _ := c.Exists(ctx(t), prefix+":{payment:1001}").Result(); n != 0 {
		t.Fatal("a token was recorded through a wrapped Ring")
	}
	// A wrapped plain client is still served.
	if err := (redisstore.Store{Client: tracedUniversal{c}, Prefix: prefix, ClockTokens: true, MaxAhead: -1}).Accept(ctx(t), "payment:1001", 1<<62); err != nil {
		t.Fatalf("wrapped *redis.Client: %v", err)
	}
}

// taggedClient is a wrapper that is not comparable (a slice field).
type taggedClient struct {
	*redis.Client
	tags []string
}

// TestRedisStoreUncomparableWrapper: looking through a wrapper must not
// compare it (== on a struct with a slice field panics).
func TestRedisStoreUncomparableWrapper(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer c.Close()
	store := redisstore.Store{Client: taggedClient{c, []string{"a"}}, Prefix: "guardtest:" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	if err := store.Accept(ctx(t), "payment:1001", 5); err != nil {
		t.Fatal(err)
	}
	store.Client = taggedClient{nil, []string{"a"}}
	if err := store.Accept(ctx(t), "payment:1001", 6); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("wrapper of a nil client: %v, want fence.ErrInvalidOption", err)
	}
}
