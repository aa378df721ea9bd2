package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bsm/redislock"
	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencerueidis"
	fenceredis "github.com/fencekit/fence/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
)

// lib is one lock library under test. acquire waits for the lock the way
// the library does and returns the function that releases it.
type lib struct {
	name    string
	acquire func(ctx context.Context, key string) (release func(), err error)
	close   func()
}

const leaseTTL = 10 * time.Second

// observerRow names fence's row with a no-op Observer set (sync off).
const observerRow = "fence (sync off, no-op Observer)"

// rueidisRow names fence's row on rueidis (fencerueidis, sync off).
const rueidisRow = "fence (rueidis, sync off)"

// libs builds every library against addr, each with its own client.
func libs(addr string) ([]*lib, error) {
	var out []*lib
	for _, f := range []struct {
		name string
		sync bool
		obs  fence.Observer
	}{
		{"fence (sync off)", false, nil},
		{"fence (sync on, 1 replica)", true, nil},
		// Every event goes through the Observer interface to methods that
		// do nothing: what observing costs fence itself.
		{observerRow, false, fence.NopObserver{}},
	} {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
		l, err := fenceredis.New(c, &fenceredis.Options{ReplicaSync: fenceredis.ReplicaSync{Disabled: !f.sync}, Observer: f.obs})
		if err != nil {
			return nil, err
		}
		out = append(out, &lib{name: f.name, close: func() { _ = c.Close() },
			acquire: func(ctx context.Context, key string) (func(), error) {
				lease, err := l.Acquire(ctx, key, fence.Wait(time.Minute), fence.TTL(leaseTTL))
				if err != nil {
					return nil, err
				}
				return func() { _ = lease.Release(ctx) }, nil
			}})
	}

	// fence's redislock over rueidis, with rueidis's defaults (automatic
	// pipelining), as rueidislock below.
	ruc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		return nil, fmt.Errorf("fencerueidis: %w", err)
	}
	rul, err := fencerueidis.New(ruc, &fenceredis.Options{ReplicaSync: fenceredis.ReplicaSync{Disabled: true}})
	if err != nil {
		return nil, err
	}
	out = append(out, &lib{name: rueidisRow, close: ruc.Close,
		acquire: func(ctx context.Context, key string) (func(), error) {
			lease, err := rul.Acquire(ctx, key, fence.Wait(time.Minute), fence.TTL(leaseTTL))
			if err != nil {
				return nil, err
			}
			return func() { _ = lease.Release(ctx) }, nil
		}})

	bc := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
	bsm := redislock.New(bc)
	// bsm/redislock does not wait unless told how; 1 ms linear retry is
	// its documented way to wait.
	bsmOpts := &redislock.Options{RetryStrategy: redislock.LinearBackoff(time.Millisecond)}
	out = append(out, &lib{name: "bsm/redislock", close: func() { _ = bc.Close() },
		acquire: func(ctx context.Context, key string) (func(), error) {
			lock, err := bsm.Obtain(ctx, key, leaseTTL, bsmOpts)
			if err != nil {
				return nil, err
			}
			return func() { _ = lock.Release(ctx) }, nil
		}})

	rc := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
	rs := redsync.New(goredis.NewPool(rc))
	out = append(out, &lib{name: "redsync", close: func() { _ = rc.Close() },
		acquire: redsyncAcquire(rs)})

	rl, err := rueidislock.NewLocker(rueidislock.LockerOption{ClientOption: rueidis.ClientOption{InitAddress: []string{addr}}})
	if err != nil {
		return nil, fmt.Errorf("rueidislock: %w", err)
	}
	out = append(out, &lib{name: "rueidislock", close: rl.Close,
		acquire: func(ctx context.Context, key string) (func(), error) {
			_, cancel, err := rl.WithContext(ctx, key)
			if err != nil {
				return nil, err
			}
			return cancel, nil
		}})
	return out, nil
}

// redsyncAcquire locks with rs's Mutex, its defaults but the lease time:
// redsync gives up after its 32 tries, so the workload calls it again
// until it succeeds (or ctx ends, or the error is not that the lock is
// taken).
func redsyncAcquire(rs *redsync.Redsync) func(ctx context.Context, key string) (func(), error) {
	return func(ctx context.Context, key string) (func(), error) {
		m := rs.NewMutex(key, redsync.WithExpiry(leaseTTL))
		for {
			err := m.LockContext(ctx)
			if err == nil {
				return func() { _, _ = m.UnlockContext(ctx) }, nil
			}
			var taken *redsync.ErrTaken
			if ctx.Err() != nil || !(errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken)) {
				return nil, err
			}
		}
	}
}

// limitScripts are the least a Redis lock can do: one EVALSHA to take a key
// if free, one to delete it if ours. No token, no waiting.
var (
	limitLock   = redis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0`)
	limitUnlock = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
)

// limitTokenLock is limitLock issuing a token too: the least a fenced
// lock adds, one more key written (a counter) when the lock is taken.
var limitTokenLock = redis.NewScript(`if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end return 0`)

// limitRow and limitTokenRow name the limits' rows.
const (
	limitRow      = "limit: 2 × EVALSHA (go-redis)"
	limitTokenRow = "limit: 2 × EVALSHA, a counter token (go-redis)"
)

// limit is the raw floor: two EVALSHA round trips through go-redis per
// acquire+release, and no waiting (it fails instead), so it only serves the
// uncontended and distinct-key workloads.
func limit(addr string) *lib { return limitWith(addr, limitRow, limitLock) }

// limitToken is limit with limitTokenLock: the floor of a fenced lock.
func limitToken(addr string) *lib { return limitWith(addr, limitTokenRow, limitTokenLock) }

// limitWith is limit with lock for its lock script, which gets the lock's
// key and a second key in its slot, and replies 0 when the lock is held.
func limitWith(addr, name string, lock *redis.Script) *lib {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
	return &lib{name: name, close: func() { _ = c.Close() },
		acquire: func(ctx context.Context, key string) (func(), error) {
			ok, err := lock.Run(ctx, c, []string{key, key + ":token"}, "me", leaseTTL.Milliseconds()).Int()
			if err != nil {
				return nil, err
			}
			if ok == 0 {
				return nil, errors.New("limit: held")
			}
			return func() { _ = limitUnlock.Run(ctx, c, []string{key}, "me").Err() }, nil
		}}
}

const limitSyncedRow = "limit: EVALSHA+WAIT 1, EVALSHA (go-redis)"

// limitSynced is limit with replica sync: the lock script and WAIT 1 in
// one pipeline (one connection, one round trip), then the unlock script.
func limitSynced(addr string) *lib {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128})
	l := &lib{name: limitSyncedRow, close: func() { _ = c.Close() }}
	l.acquire = func(ctx context.Context, key string) (func(), error) {
		var ok, acked *redis.Cmd
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			ok = limitLock.EvalSha(ctx, p, []string{key}, "me", leaseTTL.Milliseconds())
			acked = p.Do(ctx, "WAIT", 1, 1000)
			return nil
		})
		if redis.HasErrorPrefix(err, "NOSCRIPT") { // the first time
			if err := limitLock.Load(ctx, c).Err(); err != nil {
				return nil, err
			}
			return l.acquire(ctx, key)
		}
		if err != nil {
			return nil, err
		}
		if n, _ := ok.Int(); n == 0 {
			return nil, errors.New("limit: held")
		}
		if n, _ := acked.Int(); n < 1 {
			return nil, errors.New("limit: not replicated")
		}
		return func() { _ = limitUnlock.Run(ctx, c, []string{key}, "me").Err() }, nil
	}
	return l
}
