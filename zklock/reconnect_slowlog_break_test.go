package zklock_test

import (
	"strings"
	"sync"
	"testing"
	"time"
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
	var r replayed
	var log slowLog
	l, conn, ctx := watchedLocker(t, &r, 1, &log)
	holding, release := log.arm("authenticated")
	r.cutOff()
	r.healAtNextDial()
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnection within 10 s")
	}
	acquireAcross(t, ctx, l, func() {
		t.Logf("state while the line is held: %v", conn.State())
		close(release)
	})
	wantSetWatchesFirst(t, r.opsOf(1))
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
	var r replayed
	var log slowLog
	l, conn, ctx := watchedLocker(t, &r, 2, &log)
	holding, release := log.arm("send loop terminated")
	r.cutOff()
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection's send loop did not end within 10 s")
	}
	acquireAcross(t, ctx, l, func() {
		t.Logf("state while the line is held: %v", conn.State())
		r.healAtNextDial()
		close(release)
	})
	wantSetWatchesFirst(t, r.opsOf(1))
}
