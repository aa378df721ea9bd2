package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/fencekit/fence"
	"github.com/redis/go-redis/v9"
)

// naiveLocker is the control's lock: SET NX PX for the lock and a plain
// INCR counter for the token, as Redisson's fenced lock does, polling while
// it waits. The lab shows what it loses.
type naiveLocker struct{ c *redis.Client }

var naiveRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func (n *naiveLocker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	o, err := fence.Apply(opts)
	if err != nil {
		return nil, err
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	owner := hex.EncodeToString(b[:])
	deadline := time.Now().Add(o.Wait)
	poll := time.NewTimer(0)
	defer poll.Stop()
	for {
		ok, err := n.c.SetNX(ctx, "naive:"+name, owner, o.TTL).Result()
		if err != nil {
			return nil, fence.NotAcquired(name, err)
		}
		if ok {
			token, err := n.c.Incr(ctx, "naive:"+name+":token").Result()
			if err != nil {
				return nil, fence.NotAcquired(name, err)
			}
			return &naiveLease{n: n, name: name, owner: owner, token: fence.Token(token)}, nil
		}
		if time.Now().After(deadline) {
			return nil, fence.NotAcquired(name, fence.ErrHeld)
		}
		poll.Reset(5 * time.Millisecond)
		select {
		case <-ctx.Done():
			return nil, fence.NotAcquired(name, ctx.Err())
		case <-poll.C:
		}
	}
}

// naiveLease implements only what the worker uses.
type naiveLease struct {
	fence.Lease
	n     *naiveLocker
	name  string
	owner string
	token fence.Token
}

func (l *naiveLease) Token() fence.Token { return l.token }

func (l *naiveLease) Release(ctx context.Context) error {
	n, err := naiveRelease.Run(ctx, l.n.c, []string{"naive:" + l.name}, l.owner).Int()
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("naive: lock was not ours any more")
	}
	return nil
}
