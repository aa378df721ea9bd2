package zklock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/zkserver"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// connectAsking is connect with a session timeout of the test's.
func connectAsking(t testing.TB, addrs []string, asked time.Duration) *zk.Conn {
	t.Helper()
	conn, _, err := zk.Connect(addrs, asked, zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	waitFor(t, func() bool { return conn.State() == zk.StateHasSession })
	return conn
}

// A probe of the negotiated timeout on a server that hangs (SIGSTOP: it
// accepts the connection and never answers the connect request, which
// go-zookeeper would wait for ten times its receive timeout) ends with the
// Acquire's ctx, and leaves nothing running; the next Acquire probes
// again, and no lease is granted before a probe succeeded.
func TestProbeOnHungServerEndsByCtx(t *testing.T) {
	srv := startZK(t)
	l, _ := newLocker(t, []string{srv.Addr})
	srv.Stop()
	stopped := true
	defer func() {
		if stopped {
			srv.Cont()
		}
	}()

	const budget = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	began := time.Now()
	lease, err := l.Acquire(ctx, "hung-probe")
	took := time.Since(began)
	if err == nil {
		_ = lease.Release(context.Background())
		t.Fatal("Acquire on a hung server succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, fence.ErrNotAcquired) {
		t.Errorf("Acquire = %v, want ErrNotAcquired and context.DeadlineExceeded", err)
	}
	if took > budget+budget/2 {
		t.Errorf("Acquire returned %v after it began, its ctx ended after %v", took, budget)
	}
	if _, ok := l.NegotiatedTimeout(); ok {
		t.Error("NegotiatedTimeout reports a timeout the server never granted")
	}
	if n := l.Probes(); n != 1 {
		t.Errorf("%d probes, want 1", n)
	}
	t.Logf("Acquire on a hung server: %v after %v", err, took.Round(10*time.Millisecond))

	srv.Cont()
	stopped = false
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	lease, err = l.Acquire(ctx2, "hung-probe")
	if err != nil {
		t.Fatalf("Acquire once the server resumed: %v", err)
	}
	if err := lease.Release(ctx2); err != nil {
		t.Fatal(err)
	}
	if got, ok := l.NegotiatedTimeout(); !ok || got != sessionTimeout {
		t.Errorf("NegotiatedTimeout() = %v, %v; want %v, true", got, ok, sessionTimeout)
	}
	if n := l.Probes(); n != 2 {
		t.Errorf("%d probes, want 2", n)
	}
	waitFor(t, func() bool { return l.Background() == 0 })
}

// Concurrent first Acquires on one Locker share one probe; later ones
// make none.
func TestConcurrentFirstAcquiresProbeOnce(t *testing.T) {
	srv := sharedZK(t)
	l, _ := newLocker(t, []string{srv.Addr})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			lease, err := l.Acquire(ctx, fmt.Sprintf("probe-once-%d", i))
			if err == nil {
				err = lease.Release(ctx)
			}
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := l.Probes(); got != 1 {
		t.Errorf("%d probes for %d concurrent first Acquires, want 1", got, n)
	}
	lease, err := l.Acquire(ctx, "probe-once-again")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := l.Probes(); got != 1 {
		t.Errorf("%d probes after one more Acquire, want 1", got)
	}
}

// A session timeout below the servers' minSessionTimeout (2 ticks: 1 s)
// is raised by them: the session lasts longer than asked. Deadlines stay
// counted from the lower timeout, the one asked (never from the raised
// one), and NegotiatedTimeout reports the raised one.
func TestSessionTimeoutBelowServerMin(t *testing.T) {
	srv := sharedZK(t)
	const asked = 3 * zkserver.TickTime / 2 // 750 ms
	const serverMin = 2 * zkserver.TickTime
	l, err := zklock.New(connectAsking(t, []string{srv.Addr}, asked), asked)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, err := l.Acquire(ctx, "below-min")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(ctx) }()
	if left := time.Until(lease.Deadline()); left > asked {
		t.Errorf("Deadline %v away, more than the %v asked", left, asked)
	}
	if got, ok := l.NegotiatedTimeout(); !ok || got != serverMin {
		t.Errorf("NegotiatedTimeout() = %v, %v; want %v, true", got, ok, serverMin)
	}
	// The lease goes on: the monitor's checks, every third of 750 ms, move
	// its Deadline.
	first := lease.Deadline()
	waitFor(t, func() bool { return lease.Deadline().After(first.Add(asked)) })
	if err := lease.Err(); err != nil {
		t.Fatalf("lease lost: %v", err)
	}
	if left := time.Until(lease.Deadline()); left > asked {
		t.Errorf("Deadline %v away, more than the %v asked", left, asked)
	}
}

// syncBuffer is a bytes.Buffer for a slog handler and a test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A session timeout above the servers' maxSessionTimeout is lowered by
// them: the Locker's Logger says so once, NegotiatedTimeout reports it,
// and the lease's Deadline is counted from it.
func TestSessionTimeoutLoweredIsReported(t *testing.T) {
	srv := sharedZK(t)
	const asked = 2 * serverMax
	var out syncBuffer
	l, err := zklock.New(connectAsking(t, []string{srv.Addr}, asked), asked,
		zklock.WithLogger(slog.New(slog.NewTextHandler(&out, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 2 {
		lease, err := l.Acquire(ctx, "lowered")
		if err != nil {
			t.Fatal(err)
		}
		if left := time.Until(lease.Deadline()); left > serverMax {
			t.Errorf("Deadline %v away, more than the servers' %v", left, serverMax)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got, ok := l.NegotiatedTimeout(); !ok || got != serverMax {
		t.Errorf("NegotiatedTimeout() = %v, %v; want %v, true", got, ok, serverMax)
	}
	log := out.String()
	if n := strings.Count(log, "lowered the session timeout"); n != 1 {
		t.Errorf("%d lines about the lowered timeout, want 1; log:\n%s", n, log)
	}
	if !strings.Contains(log, "asked=20s negotiated=10s") {
		t.Errorf("log does not give the asked and negotiated timeouts:\n%s", log)
	}
	t.Logf("log: %s", strings.TrimSpace(log))
}

// The probe dials through WithDialer's dialer (one a TLS or proxied
// connection needs), once.
func TestProbeUsesWithDialer(t *testing.T) {
	srv := sharedZK(t)
	var mu sync.Mutex
	var dialed []string
	dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		return net.DialTimeout(network, addr, timeout)
	}
	l, err := zklock.New(connect(t, []string{srv.Addr}, nil), sessionTimeout, zklock.WithDialer(dial))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, err := l.Acquire(ctx, "probe-dialer")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dialed) != 1 || dialed[0] != srv.Addr {
		t.Errorf("the probe dialed %q through WithDialer's dialer, want [%s]", dialed, srv.Addr)
	}
}

// A probe that a hung server never answers ends on its own after the
// session timeout (5 s at least) when the caller's ctx lasts longer: the
// Acquire fails with an error that does not say the caller's ctx ended.
func TestProbeLimitOnHungServer(t *testing.T) {
	srv := startZK(t)
	l, _ := newLocker(t, []string{srv.Addr})
	srv.Stop()
	defer srv.Cont()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	lease, err := l.Acquire(ctx, "probe-limit")
	took := time.Since(began)
	if err == nil {
		_ = lease.Release(context.Background())
		t.Fatal("Acquire on a hung server succeeded")
	}
	if !errors.Is(err, fence.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no session granted") {
		t.Errorf("Acquire = %v, want ErrNotAcquired, saying no session was granted, not matching context.DeadlineExceeded", err)
	}
	if took > 30*time.Second {
		t.Errorf("Acquire returned after %v", took)
	}
	t.Logf("Acquire on a hung server, ctx of a minute: %v after %v", err, took.Round(10*time.Millisecond))
	srv.Cont()
	waitFor(t, func() bool { return l.Background() == 0 })
}
