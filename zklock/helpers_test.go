package zklock_test

import (
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/zkserver"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// sessionTimeout is the tests' session timeout: short, so that expiries
// come quickly, yet five pings long for a loaded machine.
const sessionTimeout = 2 * time.Second

// startZK starts a standalone ZooKeeper, stopped in t.Cleanup.
func startZK(t testing.TB) *zkserver.Server {
	t.Helper()
	s, err := zkserver.Start(t.TempDir())
	if err != nil {
		t.Fatalf("zkserver: %v", err)
	}
	t.Cleanup(s.Close)
	return s
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
	if dialer == nil {
		dialer = net.DialTimeout
	}
	conn, _, err := zk.Connect(addrs, sessionTimeout, zk.WithLogger(quiet{}), zk.WithDialer(dialer))
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
	conn := connect(t, addrs, nil)
	l, err := zklock.New(conn, sessionTimeout)
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
