package zklock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/refused"
	"github.com/fencekit/fence/internal/silent"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// TestNilLockerAndSessionTimeoutsMethods: NegotiatedTimeout on a nil
// Locker (a New whose error was ignored) and on a zero one, and Timeout
// and Printf on a nil SessionTimeouts, do not panic: nothing is known.
func TestNilLockerAndSessionTimeoutsMethods(t *testing.T) {
	var nilLocker *zklock.Locker
	for what, l := range map[string]*zklock.Locker{"zero": {}, "nil": nilLocker} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s Locker: NegotiatedTimeout panicked: %v", what, r)
				}
			}()
			if got, ok := l.NegotiatedTimeout(); ok || got != 0 {
				t.Errorf("%s Locker: NegotiatedTimeout = %v, %v; want 0, false", what, got, ok)
			}
		}()
	}
	var st *zklock.SessionTimeouts
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("nil SessionTimeouts: Timeout panicked: %v", r)
			}
		}()
		if got, session := st.Timeout(); got != 0 || session != 0 {
			t.Errorf("nil SessionTimeouts: Timeout = %v, %v; want 0, 0", got, session)
		}
	}()
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("nil SessionTimeouts: Printf panicked: %v", r)
			}
		}()
		// As go-zookeeper calls it, given a nil one with zk.WithLogger.
		st.Printf("authenticated: id=%d, timeout=%d", int64(1), int32(2000))
	}()
}

// TestRootsZooKeeperRefuses: a root that ZooKeeper can never hold a node
// under ("." or ".." elements, a NUL, control characters, characters
// outside the Basic Multilingual Plane or in its private use area, which
// the servers refuse though go-zookeeper lets them through, U+FFFF, bytes
// that are not UTF-8) is refused by New with fence.ErrInvalidOption,
// like a relative one, rather than accepted and then failing every
// Acquire with a backend error. Every root New accepts takes locks.
func TestRootsZooKeeperRefuses(t *testing.T) {
	srv := startZK(t)
	conn := connect(t, []string{srv.Addr}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const accepted = 12 // roots[accepted:] are valid
	roots := []string{
		"/fence/./locks", "/fence/../locks", "/fence/locks/.", "/fence/locks/..", "/.",
		"/fence\x00locks", "/fence\x01locks", "/fence\u0085locks", "/fence\ue000locks",
		"/fence\U0001F512locks", "/fence\uffff", "/fence\xfflocks",
		// accepted (ZooKeeper lets nodes be made under /zookeeper too):
		"/zookeeper", "/zookeeper/locks",
		"/.fence", "/fence/..locks", "/fence.../x", "/결제/☃", "/" + strings.Repeat("r", 200),
	}
	for i, root := range roots {
		l, err := zklock.New(conn, sessionTimeout, zklock.WithRoot(root))
		if err != nil {
			if i >= accepted {
				t.Errorf("New(WithRoot(%q)) = %v; want it accepted", root, err)
			}
			if !errors.Is(err, fence.ErrInvalidOption) {
				t.Errorf("New(WithRoot(%q)) = %v; want an error matching fence.ErrInvalidOption", root, err)
			}
			continue
		}
		lease, err := l.Acquire(ctx, "odd-root", fence.Wait(5*time.Second))
		if err != nil {
			t.Errorf("New(WithRoot(%q)) accepted it, then Acquire = %v", root, err)
			continue
		}
		if err := lease.Release(ctx); err != nil {
			t.Errorf("root %q: Release = %v", root, err)
		}
	}
}

// TestLongestOddNames: names of 256 bytes that escape to three times that
// (every byte a %XX) take and give back locks, with waiters, and do not
// share a lock with one another.
func TestLongestOddNames(t *testing.T) {
	srv := startZK(t)
	l, _ := newLocker(t, []string{srv.Addr})
	other, _ := newLocker(t, []string{srv.Addr})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names := []string{
		strings.Repeat("/", 256), strings.Repeat("%", 256), strings.Repeat(".", 256),
		strings.Repeat("☃", 85) + "a", strings.Repeat("a", 256),
	}
	var held []fence.Lease
	for _, n := range names {
		lease, err := l.Acquire(ctx, n)
		if err != nil {
			t.Fatalf("Acquire(%d-byte name %.12q...) = %v", len(n), n, err)
		}
		held = append(held, lease)
	}
	for i, n := range names {
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		got := make(chan error, 1)
		go func() {
			lease, err := other.Acquire(wctx, n, fence.Wait(10*time.Second))
			if err == nil {
				if lease.Token() <= held[i].Token() {
					err = errors.New("token did not grow")
				}
				_ = lease.Release(ctx)
			}
			got <- err
		}()
		if err := held[i].Release(ctx); err != nil {
			t.Errorf("Release(%.12q...) = %v", n, err)
		}
		if err := <-got; err != nil {
			t.Errorf("waiter on %.12q...: %v", n, err)
		}
		wcancel()
	}
}

// TestDeadServersKeepCallersDeadline: through a connection to a server
// that accepts and never answers, one that refuses connections, and an
// address with a chroot suffix (go-zookeeper has no chroot: it never
// connects), Acquire, with and without WithSessionTimeouts and a wait
// budget, returns an error within the caller's deadline, not ErrHeld; and
// once the connections are closed no goroutine is left (TestMain).
func TestDeadServersKeepCallersDeadline(t *testing.T) {
	servers := map[string]string{
		"silent":  silent.Addr(t),
		"refused": refused.Addr(t),
		"chroot":  refused.Addr(t) + "/app",
	}
	for what, addr := range servers {
		t.Run(what, func(t *testing.T) {
			for _, recorded := range []bool{false, true} {
				st := zklock.NewSessionTimeouts(quiet{})
				conn, _, err := zk.Connect([]string{addr}, sessionTimeout, zk.WithLogger(st))
				if err != nil {
					t.Logf("zk.Connect(%q) = %v", addr, err)
					return
				}
				var opts []zklock.Option
				if recorded {
					opts = append(opts, zklock.WithSessionTimeouts(st))
				}
				l, err := zklock.New(conn, sessionTimeout, opts...)
				if err != nil {
					t.Fatal(err)
				}
				for _, fopts := range [][]fence.Option{nil, {fence.Wait(time.Minute)}} {
					ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
					start := time.Now()
					lease, err := l.Acquire(ctx, "dead-server", fopts...)
					took := time.Since(start)
					cancel()
					if lease != nil || !errors.Is(err, fence.ErrNotAcquired) || errors.Is(err, fence.ErrHeld) {
						t.Errorf("recorded %v, %d opts: Acquire = %v, %v; want ErrNotAcquired, not ErrHeld", recorded, len(fopts), lease, err)
					}
					if took > 3*time.Second {
						t.Errorf("recorded %v, %d opts: Acquire took %v with a 700 ms deadline", recorded, len(fopts), took)
					}
				}
				conn.Close()
			}
		})
	}
}
