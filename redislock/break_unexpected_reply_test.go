package redislock_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// forgeReply replaces the reply of every acquire script call (EVALSHA or
// EVAL on the lock) with val.
type forgeReply struct {
	key string
	val []any
}

func (h forgeReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h forgeReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.forge(cmd)
		return err
	}
}
func (h forgeReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.forge(c)
		}
		return err
	}
}
func (h forgeReply) forge(cmd redis.Cmder) {
	c, ok := cmd.(*redis.Cmd)
	args := cmd.Args()
	if !ok || len(args) < 4 || !strings.HasPrefix(strings.ToLower(fmt.Sprint(args[0])), "eval") || fmt.Sprint(args[3]) != h.key {
		return
	}
	if n, _ := args[2].(int); n != 5 && fmt.Sprint(args[2]) != "5" {
		return // not acquire.lua (5 keys)
	}
	c.SetErr(nil)
	c.SetVal(h.val)
}

// TestUnexpectedAcquireReplyRefused: a reply that acquire.lua never gives
// (a proxy, a hook, a script of another version under the same name) is an
// error saying so, never taken as a lease, and never a panic.
func TestUnexpectedAcquireReplyRefused(t *testing.T) {
	srv := redistest.Start(t)
	const name = "lock:unexpected-reply"
	for _, val := range [][]any{
		{int64(2), int64(5)},
		{int64(-1), int64(5)},
		{int64(1), int64(5), int64(6), int64(7), int64(8)},
		{int64(1), int64(0), int64(6)},
		{int64(0), int64(5), int64(6)},
		{int64(1), int64(5), int64(6), int64(0)},
	} {
		t.Run(fmt.Sprint(val), func(t *testing.T) {
			c := srv.Client(t)
			c.AddHook(forgeReply{key: lockKey(name), val: val})
			l := lockerWith(t, c, redislock.Options{})
			ls, err := func() (ls fence.Lease, err error) {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				return l.Acquire(ctx(t), name, fence.TTL(time.Minute))
			}()
			if ls != nil {
				_ = ls.Release(ctx(t))
			}
			if err == nil || !strings.Contains(err.Error(), "unexpected reply") {
				t.Fatalf("Acquire with the script's reply forged to %v: lease %v, %v; want an unexpected reply error", val, ls != nil, err)
			}
			_ = l.WaitGiveBacks(ctx(t))
		})
	}
}
