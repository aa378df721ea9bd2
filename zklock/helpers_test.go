package zklock_test

import (
	"errors"
	"fmt"
	"net"
	"path"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/zkserver"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// sessionTimeout is the tests' session timeout: short, so that expiries
// come quickly, yet five pings long for a loaded machine.
const sessionTimeout = 2 * time.Second

// restartSession is the session timeout of tests whose leases must
// outlast a restart of their server: a restart takes 1 to 5 s on this
// machine, quiet or loaded, but a CI run saw the session back only after
// more than 10 s (ci41). Their servers are started with startZK(t,
// restartMax) to allow it (ZooKeeper's default maximum is 20 ticks, 10 s).
const restartSession = 30 * time.Second

var restartMax = fmt.Sprintf("maxSessionTimeout=%d", restartSession.Milliseconds())

// restartUnseen is reconfigure with the server's address blocked at bl
// until it serves again: the connection's dials are refused while the
// server starts, and its next one finds it serving (go-zookeeper waits ten
// receive timeouts for the answer to a connect request that a server
// accepted, 200 s for a session of restartSession).
func restartUnseen(t testing.TB, s *zkserver.Server, bl *blocker, lines ...string) {
	t.Helper()
	bl.set(true, s.Addr)
	reconfigure(t, s, lines...)
	bl.set(false, s.Addr)
}

// startZK starts a standalone ZooKeeper with config's lines added to its
// zoo.cfg, stopped in t.Cleanup.
func startZK(t testing.TB, config ...string) *zkserver.Server {
	t.Helper()
	s, err := zkserver.Start(t.TempDir(), config...)
	if err != nil {
		t.Fatalf("zkserver: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// shared is the standalone ZooKeeper that sharedZK hands out: started at
// its first use, stopped by TestMain after the last test.
var shared struct {
	once sync.Once
	srv  *zkserver.Server
	err  error
}

// closeShared stops the shared server, if a test started it.
func closeShared() {
	if shared.srv != nil {
		shared.srv.Close()
	}
}

// sharedZK returns the package's shared standalone ZooKeeper, emptied
// first (every znode but /zookeeper deleted), for a test that only talks
// to it: one that does not stop, kill, restart or reconfigure the server,
// nor count its sessions, connections or watches (mntr, wchs, cons), which
// sessions of earlier tests that have not expired yet would change. Such
// a test still starts its own with startZK. Tests that share it must not
// run in parallel (t.Parallel): each empties the tree of the one before.
// A JVM less per test: about half a second each on an idle machine, more
// on a loaded one.
func sharedZK(t testing.TB) *zkserver.Server {
	t.Helper()
	shared.once.Do(func() { shared.srv, shared.err = zkserver.Start("") })
	if shared.err != nil {
		t.Fatalf("zkserver: %v", shared.err)
	}
	emptyTree(t, shared.srv.Addr)
	return shared.srv
}

// emptyTree deletes every znode of the server at addr but /zookeeper, as
// a fresh server has them. An ephemeral node of an earlier test's session
// that has not expired yet is deleted too (the server then forgets it as
// that session's, so the session's expiry deletes nothing of a later
// test's).
func emptyTree(t testing.TB, addr string) {
	t.Helper()
	conn, _, err := zk.Connect([]string{addr}, sessionTimeout, zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var del func(p string) error
	del = func(p string) error {
		children, _, err := conn.Children(p)
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if errors.Is(err, zk.ErrNoAuth) && p != "/" {
			children, err = nil, nil // a lock node a test made unreadable: a leaf
		}
		if err != nil {
			return err
		}
		for _, c := range children {
			if p == "/" && c == "zookeeper" {
				continue
			}
			if err := del(path.Join(p, c)); err != nil {
				return err
			}
		}
		if p == "/" {
			return nil
		}
		if err := conn.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		return nil
	}
	end := time.Now().Add(10 * time.Second)
	for {
		err := del("/")
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("emptying the shared ZooKeeper: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline: a node made meanwhile (ErrNotEmpty)
	}
}

// startEnsemble starts n ZooKeeper servers as one ensemble, stopped in
// t.Cleanup.
func startEnsemble(t testing.TB, n int) *zkserver.Ensemble {
	t.Helper()
	e, err := zkserver.StartEnsemble(t.TempDir(), n)
	if err != nil {
		t.Fatalf("zkserver: %v", err)
	}
	t.Cleanup(e.Close)
	return e
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

// connect opens a session, closed in t.Cleanup, and waits until it is
// established.
// A dialer other than nil replaces net.DialTimeout.
func connect(t testing.TB, addrs []string, dialer zk.Dialer) *zk.Conn {
	t.Helper()
	return connectFor(t, addrs, dialer, sessionTimeout)
}

// connectFor is connect with a session timeout of timeout.
func connectFor(t testing.TB, addrs []string, dialer zk.Dialer, timeout time.Duration) *zk.Conn {
	t.Helper()
	if dialer == nil {
		dialer = net.DialTimeout
	}
	conn, _, err := zk.Connect(addrs, timeout, zk.WithLogger(quiet{}), zk.WithDialer(dialer))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	end := time.Now().Add(10 * time.Second)
	for conn.State() != zk.StateHasSession {
		if time.Now().After(end) {
			t.Fatalf("no session after 10 s: state %v", conn.State())
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	return conn
}

// newLocker connects a session and returns a Locker on it.
func newLocker(t testing.TB, addrs []string) (*zklock.Locker, *zk.Conn) {
	t.Helper()
	return newLockerFor(t, addrs, nil, sessionTimeout)
}

// newLockerFor is newLocker with a dialer (nil: net.DialTimeout) and a
// session timeout of timeout.
func newLockerFor(t testing.TB, addrs []string, dialer zk.Dialer, timeout time.Duration) (*zklock.Locker, *zk.Conn) {
	t.Helper()
	conn := connectFor(t, addrs, dialer, timeout)
	l, err := zklock.New(conn, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return l, conn
}

// lockNodes returns the nodes in the directory of the lock called name, in
// their order of creation.
func lockNodes(t testing.TB, conn *zk.Conn, name string) []string {
	t.Helper()
	dir := zklock.DefaultRoot + "/" + zklock.Escape(name)
	children, _, err := conn.Children(dir)
	if err != nil {
		t.Fatalf("children of %s: %v", dir, err)
	}
	sort.Slice(children, func(i, j int) bool { return seq(children[i]) < seq(children[j]) })
	for i, c := range children {
		children[i] = dir + "/" + c
	}
	return children
}

func seq(node string) string { return node[strings.LastIndex(node, "-")+1:] }

// newLockerDialer is newLocker with a dialer of the test's.
func newLockerDialer(t testing.TB, addrs []string, dialer zk.Dialer) *zklock.Locker {
	t.Helper()
	l, err := zklock.New(connect(t, addrs, dialer), sessionTimeout)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
