package cli

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// syncBuffer is a bytes.Buffer safe for the status line's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}
func (b *syncBuffer) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.b.String() }

// acquireWaiting runs exec's acquisition, with a wait budget, on a lock
// held by another owner, with stderr a terminal or not as tty says; it
// releases the lock once the status line was drawn three times (on a
// terminal) or after 300 ms (elsewhere), and returns stderr.
func acquireWaiting(t *testing.T, tty bool) string {
	t.Helper()
	old := stderrIsTerminal
	stderrIsTerminal = func(io.Writer) bool { return tty }
	t.Cleanup(func() { stderrIsTerminal = old })

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
	var stderr syncBuffer
	type result struct {
		lease fence.Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		lease, err := acquireShowing(ctx, &stderr, l, "job", 20*time.Second, []fence.Option{fence.Wait(20 * time.Second)})
		done <- result{lease, err}
	}()
	start := time.Now()
	for tty && strings.Count(stderr.String(), "waiting for") < 3 || !tty && time.Since(start) < 300*time.Millisecond {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("no progress shown on a terminal: stderr %q", stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("acquire after the release: %v", r.err)
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return stderr.String()
}

// TestProgressExecTerminal: on a terminal exec shows a status line while it
// waits for the lock, rewritten in place, and clears it when the lock is
// granted.
func TestProgressExecTerminal(t *testing.T) {
	errOut := acquireWaiting(t, true)
	if !strings.HasPrefix(errOut, "\r\x1b[K| fence: waiting for \"job\" 0s\r\x1b[K/ fence: waiting for \"job\" ") ||
		!strings.HasSuffix(errOut, "\r\x1b[K") || strings.Contains(errOut, "\n") {
		t.Fatalf("stderr %q", errOut)
	}
}

// TestProgressExecNotTerminal: elsewhere exec writes nothing while it
// waits, as before progress existed.
func TestProgressExecNotTerminal(t *testing.T) {
	if errOut := acquireWaiting(t, false); errOut != "" {
		t.Fatalf("stderr %q, want exactly empty", errOut)
	}
}
