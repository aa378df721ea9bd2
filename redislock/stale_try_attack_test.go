package redislock_test

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// transit is a go-redis Dialer whose connections, once armed, hold the
// next write that contains match in transit, as a network that delays a
// packet: the client's read times out and it closes the connection, yet
// (as TCP sends what was written before the FIN) the request reaches the
// server when deliver is called, and runs.
//
// next, when set, becomes match as deliver sends the held request, the
// transit armed again: it holds what that request's reply sets off.
type transit struct {
	match []byte
	next  []byte
	mu    sync.Mutex
	armed bool
	held  *transitConn
	data  []byte
}

func (tr *transit) arm() { tr.mu.Lock(); tr.armed = true; tr.mu.Unlock() }

func (tr *transit) holding() bool { tr.mu.Lock(); defer tr.mu.Unlock(); return tr.held != nil }

// deliver sends the held request on its connection, then closes it if
// the client has.
func (tr *transit) deliver() error {
	tr.mu.Lock()
	c, p := tr.held, tr.data
	tr.held, tr.data = nil, nil
	closed := c != nil && c.closed
	if c != nil && tr.next != nil {
		tr.match, tr.next, tr.armed = tr.next, nil, true
	}
	tr.mu.Unlock()
	if c == nil {
		return nil
	}
	_ = c.Conn.SetDeadline(time.Time{}) // the client's, long passed
	_, err := c.Conn.Write(p)
	if closed {
		_ = c.Conn.Close()
	}
	return err
}

func (tr *transit) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &transitConn{Conn: c, tr: tr}, nil
}

type transitConn struct {
	net.Conn
	tr     *transit
	closed bool // guarded by tr.mu
}

func (c *transitConn) Write(p []byte) (int, error) {
	tr := c.tr
	tr.mu.Lock()
	if tr.armed && bytes.Contains(p, tr.match) {
		tr.armed, tr.held, tr.data = false, c, bytes.Clone(p)
		tr.mu.Unlock()
		return len(p), nil
	}
	tr.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *transitConn) Close() error {
	tr := c.tr
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.held == c {
		c.closed = true // closed once the held request is sent
		return nil
	}
	return c.Conn.Close()
}

// TestStaleWaitingTryAfterRelease: a waiter's try is delayed on the
// network past the client's read timeout; go-redis gives up on it,
// closes the connection and sends it again, and the waiter goes on (the
// resend queued it again). It gets the lock by a grant, uses it and
// releases it. Then the delayed try reaches Redis, finds the lock free
// and takes it, for the owner of an Acquire that has returned: the lock
// is held by nobody for the lease time (a minute here), though the
// package documentation says an acquisition whose answer was lost (the
// client's own timeout closed the connection, yet the command may still
// run) is revoked. Another Acquire, waiting 3 s, must get the lock.
func TestStaleWaitingTryAfterRelease(t *testing.T) {
	staleWaitingTry(t, 0, "3") // go-redis's resend is try 3
}

// TestStaleWaitingTryRetriedByLocker: the same, but the client does not
// send the delayed try again (MaxRetries -1): its read times out and the
// waiting Acquire, seeing a transient error, sends the next try itself,
// with the same owner (try 4, after its pause). That left the delayed
// try unrevoked: it took the lock after the Release (held for 57 s of a
// minute).
func TestStaleWaitingTryRetriedByLocker(t *testing.T) {
	staleWaitingTry(t, -1, "4")
}

// staleWaitingTry runs the scenario of TestStaleWaitingTryAfterRelease on
// a client with maxRetries, whose waiter's entry shows try number again
// once the delayed try was sent again.
func staleWaitingTry(t *testing.T, maxRetries int, again string) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:stale-try"
	lock := lockKey(name)
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	holder := acquire(t, lockerWith(t, srv.Client(t), opts), name, fence.TTL(time.Minute))
	tr := &transit{match: []byte(lock)}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: tr.dial, ReadTimeout: 300 * time.Millisecond, MaxRetries: maxRetries})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, opts)
	got := make(chan error, 1)
	go func() {
		ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		got <- err
	}()
	entry := func(try string) func() bool {
		return func() bool {
			vals := admin.HVals(ctx(t), lock+":waiters").Val()
			return len(vals) == 1 && len(bytes.Fields([]byte(vals[0]))) > 1 && string(bytes.Fields([]byte(vals[0]))[1]) == try
		}
	}
	waitFor(t, entry("2")) // subscribed after its first try, it tried again
	// A message that is no grant wakes it to try (as a release of an
	// older fence does); that try is delayed on the way.
	tr.arm()
	if err := admin.Publish(ctx(t), lock+":released", "released").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, tr.holding)
	waitFor(t, entry(again)) // sent again, after the read timed out
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, admin, "evalsha")
	if err := tr.deliver(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return commandCalls(t, admin, "evalsha") > before })
	start := time.Now()
	ls, err := lockerWith(t, srv.Client(t), opts).Acquire(ctx(t), name, fence.Wait(3*time.Second), fence.TTL(time.Second))
	if err != nil {
		t.Fatalf("after the waiter released the lock and its delayed try ran: %v after %v; the lock is held for %v by %s", err, time.Since(start).Round(time.Millisecond), admin.PTTL(ctx(t), lock).Val(), admin.Get(ctx(t), lock).Val())
	}
	_ = ls.Release(ctx(t))
}
