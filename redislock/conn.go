package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/pause"
	"github.com/fencekit/fence/internal/redisconn"
	"github.com/redis/go-redis/v9"
)

// A Locker on a redisconn.Conn (built by fencerueidis through
// redisconn.NewLocker) runs the same algorithm as one on go-redis: the
// functions here replace the go-redis calls at the few places that make
// them (run, evalOnce, Status, read), and everything else is shared. A
// Conn is one primary: a Locker on one is never sharded.
func init() {
	redisconn.NewLocker = func(c redisconn.Conn, opts any) (any, error) {
		if c == nil {
			return nil, fmt.Errorf("%w: redislock: nil connection", fence.ErrInvalidOption)
		}
		o, _ := opts.(*Options)
		return newLocker(nil, c, o)
	}
}

// run runs script on c, or through the Locker's Conn, and returns its
// reply as a go-redis command.
func (l *Locker) run(ctx context.Context, c redis.Cmdable, script *redis.Script, keys skeys, args ...any) *redis.Cmd {
	if l.conn == nil {
		reply, _, _ := l.evalPipelined(ctx, c, false, 0, script, keys, args)
		return reply
	}
	reply, _, _ := l.evalConn(ctx, script, keys.names, args, 0, 0)
	return reply
}

// evalConn runs script through the Conn, followed by WAIT when required
// is above zero.
func (l *Locker) evalConn(ctx context.Context, script *redis.Script, keys []string, args []any, required int, timeout time.Duration) (*redis.Cmd, int, error) {
	v, acked, err := l.conn.Eval(ctx, connScripts[script], keys, args, required, timeout)
	cmd := redis.NewCmd(ctx)
	if errors.Is(err, redisconn.ErrWait) {
		// The script ran (it may have taken the lock): its reply, and
		// WAIT's error as the go-redis path reports it.
		cmd.SetVal(v)
		return cmd, 0, waitError(err)
	}
	if err == nil && v == nil {
		err = redis.Nil
	}
	if err != nil {
		cmd.SetErr(err)
		return cmd, 0, err
	}
	cmd.SetVal(v)
	return cmd, acked, nil
}

// readConn is read through the Conn: it delivers w's messages until the
// last waiter leaves. When the subscription breaks after it was confirmed,
// it subscribes again with back-off and wakes every waiter, since releases
// published meanwhile were lost; a failure before the confirmation fails
// the subscription, and the waiters retry.
func (l *Locker) readConn(ctx context.Context, w *subscription) {
	var confirmed atomic.Bool // since the last break; ready runs on the Conn's goroutine
	ready := func() {
		confirmed.Store(true)
		select {
		case <-w.ready:
			l.subscribedAgain(w) // subscribed again: look again
		default:
			w.setReady(nil)
		}
	}
	message := func(payload string) { l.deliver(w, payload) }
	failures := 0
	for {
		err := l.conn.Subscribe(ctx, w.channel, ready, message)
		if ctx.Err() != nil {
			l.drop(w, errors.Join(err, ctx.Err()))
			return
		}
		if err == nil {
			err = redisconn.ErrUnsubscribed
		}
		select {
		case <-w.ready:
		default: // not confirmed yet: fail it; waiters retry
			l.drop(w, err)
			return
		}
		l.wakeAll(w)
		if confirmed.Swap(false) {
			failures = 0
		}
		failures++
		if !pause.For(ctx, pause.Backoff(failures)) {
			l.drop(w, ctx.Err())
			return
		}
	}
}
