package cli

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// A library's log line (go-redis's "sentinel: selected addr=…", written
// through fence's logger to stderr) while exec's status line is shown on
// the terminal: it must start a line of its own, the status line
// cleared first and drawn again beneath it, not be glued after the
// spinner's text ("…waiting for "job" 1.2sredis: …").
func TestProgressLibraryLogLine(t *testing.T) {
	old := stderrIsTerminal
	stderrIsTerminal = func(io.Writer) bool { return true }
	t.Cleanup(func() { stderrIsTerminal = old })
	var stderr syncBuffer
	logger := newLibLogger(nil, &stderr)
	oldLog := libLog
	libLog = logger
	t.Cleanup(func() { libLog = oldLog })

	l, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, err := l.Acquire(ctx, "job", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		lease, err := acquireShowing(ctx, &stderr, l, "job", 20*time.Second, []fence.Option{fence.Wait(20 * time.Second)})
		if err == nil {
			err = lease.Release(ctx)
		}
		done <- err
	}()
	start := time.Now()
	for !strings.Contains(stderr.String(), "waiting for") {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("no status line: %q", stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	logger.Printf(ctx, "redis: sentinel: selected addr=%s masterAddr=%s", "127.0.0.1:26379", "127.0.0.1:6380")
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// After the status line stopped, log lines go straight to stderr.
	logger.Printf(ctx, "after")
	out := stderr.String()
	for _, line := range strings.Split(out, "\n") {
		// What a terminal shows before the log line: the text after the
		// last clearing of the line.
		i := strings.Index(line, "redis: sentinel")
		if i < 0 {
			continue
		}
		before := line[:i]
		if j := strings.LastIndex(before, "\r\x1b[K"); j >= 0 {
			before = before[j+len("\r\x1b[K"):]
		}
		if before != "" {
			t.Fatalf("the log line shares a line with the status line: %q in %q", line, out)
		}
	}
	if !strings.Contains(out, "redis: sentinel: selected addr=127.0.0.1:26379 masterAddr=127.0.0.1:6380\n") || !strings.HasSuffix(out, "\r\x1b[Kafter\n") && !strings.HasSuffix(out, "\nafter\n") {
		t.Fatalf("stderr %q", out)
	}
}

// Interrupted while waiting (SIGINT cancels Main's context): the status
// line is cleared before acquireShowing returns, so the error that follows
// starts a clean line, and nothing is drawn after it.
func TestProgressInterruptedClears(t *testing.T) {
	old := stderrIsTerminal
	stderrIsTerminal = func(io.Writer) bool { return true }
	t.Cleanup(func() { stderrIsTerminal = old })
	l, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	bg, cancelBG := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelBG()
	holder, err := l.Acquire(bg, "job", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Release(bg) }()
	var stderr syncBuffer
	ctx, interrupt := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := acquireShowing(ctx, &stderr, l, "job", 20*time.Second, []fence.Option{fence.Wait(20 * time.Second)})
		done <- err
	}()
	start := time.Now()
	for !strings.Contains(stderr.String(), "waiting for") {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("no status line: %q", stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	interrupt()
	if err := <-done; err == nil {
		t.Fatal("Acquire succeeded after the interrupt")
	}
	out := stderr.String()
	if !strings.HasSuffix(out, "\r\x1b[K") {
		t.Fatalf("status line not cleared at the interrupt: %q", out)
	}
	// Stop joined the redrawing goroutine: nothing is drawn after it.
	if again := stderr.String(); again != out {
		t.Fatalf("drawn after Stop: %q", again)
	}
}

// TestLibLoggerDropsPoolNoise: go-redis's note that a connection was closed
// under it (a subscription closed as exec stops waiting) is not printed;
// its other lines are, credentials scrubbed.
func TestLibLoggerDropsPoolNoise(t *testing.T) {
	var b strings.Builder
	l := newLibLogger([]string{"--redis", "redis://:secret@h:6379"}, &b)
	l.Printf(context.Background(), "pool.go:1458: Unexpected conn[%d] state changed by hook to CLOSED, closing it", 1)
	if b.Len() != 0 {
		t.Errorf("pool noise printed: %q", b.String())
	}
	l.Printf(context.Background(), "dial redis://:secret@h:6379: connection refused")
	if got := b.String(); !strings.Contains(got, "connection refused") || strings.Contains(got, "secret") {
		t.Errorf("printed %q; want the line, scrubbed", got)
	}
}
