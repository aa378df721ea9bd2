package progress_test

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/progress"
)

// buffer is a bytes.Buffer safe for the status line's goroutine.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) { b.mu.Lock(); defer b.mu.Unlock(); return b.b.Write(p) }
func (b *buffer) String() string              { b.mu.Lock(); defer b.mu.Unlock(); return b.b.String() }

const cl = "\r\x1b[K"

// TestProgressOnTerminal: on a terminal the status line is drawn at once,
// redrawn every Interval with the next spinner frame and the time elapsed,
// cleared before each line of the work's and drawn again after it, not
// drawn after an unfinished line, and cleared by Stop.
func TestProgressOnTerminal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out buffer
		s := progress.Start(&out, true, "lab")
		time.Sleep(2*progress.Interval + progress.Interval/4) // two redraws
		synctest.Wait()
		fmt.Fprintln(s, "run 1 passed")
		fmt.Fprint(s, "half a line")
		time.Sleep(progress.Interval) // a tick while the line is unfinished
		synctest.Wait()
		fmt.Fprint(s, " ended\n")
		s.Stop()
		s.Stop() // twice is harmless
		fmt.Fprintln(s, "after Stop")
		want := cl + "| lab 0s" +
			cl + "/ lab 200ms" +
			cl + "- lab 400ms" +
			cl + "run 1 passed\n" + cl + "- lab 500ms" +
			cl + "half a line" +
			" ended\n" + cl + "\\ lab 700ms" +
			cl + "after Stop\n"
		if got := out.String(); got != want {
			t.Fatalf("terminal output\n%q\nwant\n%q", got, want)
		}
	})
}

// TestProgressNotTerminal: elsewhere the work's lines pass through byte for
// byte, with nothing added, and no goroutine is started.
func TestProgressNotTerminal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out buffer
		lines := "built the worker in 1.2s\nscenario 1 control: violation seen\npartial"
		s := progress.Start(&out, false, "lab")
		time.Sleep(10 * progress.Interval)
		for _, l := range strings.SplitAfter(lines, "\n") {
			fmt.Fprint(s, l)
		}
		s.Stop()
		if got := out.String(); got != lines {
			t.Fatalf("output %q, want exactly %q", got, lines)
		}
	})
	var nilStatus *progress.Status
	nilStatus.Stop()
	if n, err := nilStatus.Write([]byte("x")); n != 1 || err != nil {
		t.Fatal(n, err)
	}
}

// TestIsTerminal: a buffer and a regular file are not terminals.
func TestIsTerminal(t *testing.T) {
	f, err := os.Create(t.TempDir() + "/f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if progress.IsTerminal(&bytes.Buffer{}) || progress.IsTerminal(f) {
		t.Fatal("a buffer or a file taken for a terminal")
	}
}

func TestElapsed(t *testing.T) {
	for d, want := range map[time.Duration]string{
		1234 * time.Millisecond: "1.2s", 59*time.Second + 940*time.Millisecond: "59.9s",
		83*time.Second + 400*time.Millisecond: "1m23s",
	} {
		if got := progress.Elapsed(d); got != want {
			t.Errorf("Elapsed(%v) = %q, want %q", d, got, want)
		}
	}
}
