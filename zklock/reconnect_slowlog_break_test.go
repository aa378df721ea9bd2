package zklock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// slowLog is a zk.Logger that, once armed, holds the first line whose
// format starts with prefix until the test releases it: a logger that
// blocks (a full stderr pipe, a log shipper that stalls). go-zookeeper
// logs on its own goroutines, in the middle of its reconnection.
type slowLog struct {
	mu      sync.Mutex
	prefix  string
	holding chan struct{} // closed once the line is held
	release chan struct{} // closed by the test
}

func (s *slowLog) arm(prefix string) (holding, release chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prefix = prefix
	s.holding, s.release = make(chan struct{}), make(chan struct{})
	return s.holding, s.release
}

func (s *slowLog) Printf(format string, _ ...any) {
	s.mu.Lock()
	hold := s.prefix != "" && strings.HasPrefix(format, s.prefix)
	holding, release := s.holding, s.release
	if hold {
		s.prefix = ""
	}
	s.mu.Unlock()
	if hold {
		close(holding)
		<-release
	}
}

// The session's settling (awaitSession: the session seen on two checks
// retryPause apart) assumes that go-zookeeper re-sets its watches within
// retryPause of reporting the session. It reports it (StateHasSession),
// then logs its "authenticated" line, and only then starts the loop that
// sends and calls sendSetWatches, which reads lastZxid: a logger that
// takes longer than retryPause over that line (a blocked stderr) keeps the
// session reported and the watches not re-set. An Acquire then queues its
// create, which the send loop writes first, before setWatches: the
// lastZxid race of TestAcquireNotQueuedWhileReconnecting.
func TestAcquireNotSentBeforeSetWatchesSlowLogger(t *testing.T) {
	t.Skip("limit, documented (package doc, Calls and contexts): go-zookeeper reports the session before it re-sets its watches and shows nothing once it has; a zk.Logger that blocks on its \"authenticated\" line past retryPause lets an Acquire's create go first (opcodes [1 101 ...])")
	srv := sharedZK(t)
	var r replayed
	var log slowLog
	const long = 10 * time.Second
	conn, _, err := zk.Connect([]string{srv.Addr}, long, zk.WithLogger(&log), zk.WithDialer(r.dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	l, err := zklock.New(conn, long)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	watched, err := l.Acquire(ctx, "slowlog-watched") // its node is watched
	if err != nil {
		t.Fatal(err)
	}
	holding, release := log.arm("authenticated")
	r.cutOff()
	r.healAtNextDial()
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnection within 10 s")
	}
	type result struct {
		lease fence.Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		ls, err := l.Acquire(ctx, "slowlog-other")
		done <- result{ls, err}
	}()
	waitParked(t, "zklock.(*Locker).acquire(")
	state := conn.State()
	close(release)
	var res result
	select {
	case res = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the Acquire did not return within 20 s of the reconnection")
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	ops := r.opsOf(1)
	t.Logf("state while the line was held: %v; opcodes on the reconnected connection: %v", state, ops)
	for _, op := range ops {
		if op == 11 { // ping
			continue
		}
		if op != 101 {
			t.Fatalf("the reconnected connection wrote opcode %d before setWatches: opcodes %v", op, ops)
		}
		break
	}
	for _, ls := range []fence.Lease{res.lease, watched} {
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// The other end of a connection: go-zookeeper reports the connection lost
// (StateDisconnected) only once its send loop has returned and logged
// "send loop terminated". Until then the state still says
// StateHasSession, and a request is queued for a send loop that has gone:
// with more than one server address (an ensemble), go-zookeeper moves to
// the next one without failing the requests still queued, and sends them
// on that connection first, before setWatches. A logger that takes longer
// than retryPause over that line keeps it so. (The two addresses here are
// the same server's.)
func TestAcquireNotQueuedWhileConnectionEndsSlowLogger(t *testing.T) {
	t.Skip("limit, documented (package doc, Calls and contexts): go-zookeeper reports a connection lost only after its send loop logged its end; a zk.Logger that blocks there keeps StateHasSession reported, and with several server addresses the create queued meanwhile goes first on the next connection (opcodes [1 101 ...])")
	srv := sharedZK(t)
	var r replayed
	var log slowLog
	const long = 10 * time.Second
	conn, _, err := zk.Connect([]string{srv.Addr, srv.Addr}, long, zk.WithLogger(&log), zk.WithDialer(r.dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	l, err := zklock.New(conn, long)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	watched, err := l.Acquire(ctx, "slowlog-watched") // its node is watched
	if err != nil {
		t.Fatal(err)
	}
	holding, release := log.arm("send loop terminated")
	r.cutOff()
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection's send loop did not end within 10 s")
	}
	type result struct {
		lease fence.Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		ls, err := l.Acquire(ctx, "slowlog-other")
		done <- result{ls, err}
	}()
	waitParked(t, "zklock.(*Locker).acquire(")
	state := conn.State()
	r.healAtNextDial()
	close(release)
	var res result
	select {
	case res = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the Acquire did not return within 20 s of the reconnection")
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	ops := r.opsOf(1)
	t.Logf("state while the line was held: %v; opcodes on the reconnected connection: %v", state, ops)
	for _, op := range ops {
		if op == 11 { // ping
			continue
		}
		if op != 101 {
			t.Fatalf("the reconnected connection wrote opcode %d before setWatches: opcodes %v", op, ops)
		}
		break
	}
	for _, ls := range []fence.Lease{res.lease, watched} {
		if err := ls.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
