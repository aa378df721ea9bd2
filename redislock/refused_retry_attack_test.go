package redislock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// lostReply is a go-redis Dialer whose connections, once armed, let the
// next write that contains match reach the server, read its reply off the
// socket and drop it, and break the connection (io.EOF): the command ran,
// its answer was lost. From then on, while refusing, every dial is refused
// (ECONNREFUSED), as while a server restarts or a proxy sheds connections.
type lostReply struct {
	match  []byte
	mu     sync.Mutex
	armed  bool
	refuse bool
	lost   bool // the reply of the matched write was dropped
}

func (lr *lostReply) set(f func()) { lr.mu.Lock(); f(); lr.mu.Unlock() }

func (lr *lostReply) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	lr.mu.Lock()
	refuse := lr.refuse
	lr.mu.Unlock()
	if refuse {
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lostReplyConn{Conn: c, lr: lr}, nil
}

type lostReplyConn struct {
	net.Conn
	lr   *lostReply
	drop bool
}

func (c *lostReplyConn) Write(p []byte) (int, error) {
	lr := c.lr
	lr.mu.Lock()
	if lr.armed && bytes.Contains(p, lr.match) {
		lr.armed, c.drop = false, true
	}
	lr.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *lostReplyConn) Read(p []byte) (int, error) {
	if !c.drop {
		return c.Conn.Read(p)
	}
	// The server ran the command: its reply arrives, and is lost with
	// the connection.
	var buf [512]byte
	if _, err := c.Conn.Read(buf[:]); err != nil {
		return 0, err
	}
	c.lr.set(func() { c.lr.lost, c.lr.refuse = true, true })
	_ = c.Conn.Close()
	return 0, io.EOF
}

// TestRefusedRetryAfterLostReplyGivesBack: an Acquire's script runs and
// takes the lock, but its reply is lost with the connection (EOF); go-redis
// sends it again (MaxRetries, default 3) on a new connection, whose dial is
// refused, as while the server restarts. Acquire returns the refusal, which
// must not be taken for "never sent" (it was, before mayRunLate counted a
// refusal on a client that resends): nothing gave the lock back, and it was
// held, by nobody, for the lease time (a minute here). The give-back, itself
// refused, is parked until the server answers. Another Acquire, waiting 3 s
// once the dials are accepted again, must get the lock.
func TestRefusedRetryAfterLostReplyGivesBack(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:refused-retry"
	lock := lockKey(name)
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	lr := &lostReply{match: []byte(lock)}
	l, c := lockerDialing(t, srv, lr, &redis.Options{DialerRetries: 1})
	given := &refusedRelease{lock: lock, refused: make(chan struct{})}
	c.AddHook(given)
	// Scripts loaded (no NOSCRIPT), a connection in the pool.
	if err := acquire(t, l, "lock:warm-up").Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	lr.set(func() { lr.armed = true })
	_, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	t.Logf("Acquire: %v (ECONNREFUSED: %v); lock %q PTTL %v", err, errors.Is(err, syscall.ECONNREFUSED), admin.Get(ctx(t), lock).Val(), admin.PTTL(ctx(t), lock).Val())
	if err == nil {
		t.Fatal("the retry got through")
	}
	lr.set(func() {
		if !lr.lost {
			t.Fatalf("no reply was dropped: %v", err)
		}
	})
	// The give-back is refused too before the server answers again: it
	// must be sent again later (parked), not dropped.
	select {
	case <-given.refused:
	case <-time.After(10 * time.Second):
		t.Fatal("no release of the lock was sent after the failed Acquire")
	}
	lr.set(func() { lr.refuse = false })
	start := time.Now()
	ls, err := lockerWith(t, srv.Client(t), opts).Acquire(ctx(t), name, fence.Wait(3*time.Second), fence.TTL(time.Second))
	if err != nil {
		t.Fatalf("after an Acquire that failed with a refused dial, its first copy having run: %v after %v; the lock is held for %v by %s", err, time.Since(start).Round(time.Millisecond), admin.PTTL(ctx(t), lock).Val(), admin.Get(ctx(t), lock).Val())
	}
	_ = ls.Release(ctx(t))
}

// refusedRelease is a go-redis hook that closes refused when a release
// script (ReleaseKeys keys) sent for lock fails with a refused connection.
type refusedRelease struct {
	lock    string
	once    sync.Once
	refused chan struct{}
}

func (r *refusedRelease) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *refusedRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		r.check(cmd, err)
		return err
	}
}
func (r *refusedRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			r.check(cmd, cmd.Err())
		}
		return err
	}
}

func (r *refusedRelease) check(cmd redis.Cmder, err error) {
	args := cmd.Args()
	if len(args) > 3 && cmd.Name() == "evalsha" && fmt.Sprint(args[2]) == fmt.Sprint(redislock.ReleaseKeys) && args[3] == r.lock && errors.Is(err, syscall.ECONNREFUSED) {
		r.once.Do(func() { close(r.refused) })
	}
}
