package guard_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// redisLossDesign is the fix this file's tests would need; see
// TestRedisStoreKeyLost.
const redisLossDesign = "design question: redisstore.Store accepts a stale token once Redis has lost the resource's record; " +
	"the store cannot tell a lost record from a resource never fenced. The fix I would choose, as an option for clock-floored tokens (redislock's): " +
	"a missing record is created with the Redis server's TIME in µs as its last token, and the token is then compared with it, " +
	"so that only tokens issued after the loss are accepted (every holder from before it re-acquires once, and the first holder of a new resource too); " +
	"and, against failover, WAIT for the replicas in Accept as redislock's replica sync does, refusing when too few acknowledge. " +
	"Until then the package doc's requirements (AOF always, no allkeys eviction, no failover to a lagging replica) are all that stands"

// TestRedisStoreKeyLost: the ways, other than a restart without persistence
// (TestRedisStoreForgetsAfterRestart), that a Redis loses redisstore's
// record of a resource, each followed by the stale token 5 after 7 was
// accepted: an operator's DEL (or FLUSHDB), an eviction under maxmemory with
// allkeys-lru, and a failover to a replica that had not received the
// record. Each is a stale token accepted; the test runs them, so that a fix
// is seen, and skips with the design question when the hole shows.
func TestRedisStoreKeyLost(t *testing.T) {
	var accepted []string
	check := func(t *testing.T, store redisstore.Store, how string) {
		t.Helper()
		err := store.Accept(ctx(t), "payment:1001", 5)
		switch {
		case err == nil:
			accepted = append(accepted, how)
		case errors.Is(err, guard.ErrStale):
		default:
			t.Logf("%s: token 5 refused with %v", how, err)
		}
	}
	accept7 := func(t *testing.T, store redisstore.Store) {
		t.Helper()
		if err := store.Accept(ctx(t), "payment:1001", 7); err != nil {
			t.Fatal(err)
		}
		if err := store.Accept(ctx(t), "payment:1001", 5); !errors.Is(err, guard.ErrStale) {
			t.Fatalf("token 5 after 7: %v, want ErrStale", err)
		}
	}

	t.Run("del", func(t *testing.T) {
		store := redisStore(t)
		accept7(t, store)
		c := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer c.Close()
		if err := c.Del(ctx(t), store.Prefix+":{payment:1001}").Err(); err != nil {
			t.Fatal(err)
		}
		check(t, store, "after an operator's DEL")
	})

	t.Run("allkeys-lru", func(t *testing.T) {
		srv := redistest.Start(t, "--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru")
		c := srv.Client(t)
		store := redisstore.Store{Client: c}
		accept7(t, store)
		filler := strings.Repeat("x", 64<<10)
		deadline := time.Now().Add(30 * time.Second)
		for i := 0; ; i++ {
			n, err := c.Exists(ctx(t), "fence:guard:{payment:1001}").Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Logf("record evicted after %d fillers", i)
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("record not evicted within 30 s")
			}
			if err := c.Set(ctx(t), "filler:"+strconv.Itoa(i), filler, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		check(t, store, "after an allkeys-lru eviction")
	})

	t.Run("failover", func(t *testing.T) {
		primary := redistest.Start(t)
		replica := redistest.StartReplica(t, primary)
		redistest.WaitReplicated(t, primary, 1)
		pc := primary.Client(t)
		rc := replica.Client(t)
		// The replica is cut off (as by a partition) before token 7 is
		// accepted, and is then promoted.
		if err := rc.Do(ctx(t), "REPLICAOF", "NO", "ONE").Err(); err != nil {
			t.Fatal(err)
		}
		accept7(t, redisstore.Store{Client: pc})
		check(t, redisstore.Store{Client: rc}, "after a failover to a replica that missed token 7")
	})

	if len(accepted) > 0 {
		t.Skipf("stale token 5 accepted %s. %s", strings.Join(accepted, ", "), redisLossDesign)
	}
}
