// Package progress shows the fence command's long work on a terminal: one
// status line, a spinner and the time elapsed, rewritten in place with a
// carriage return and cleared at the end. Where the output is not a
// terminal (a file, a pipe, a CI log) it shows nothing and passes the
// command's own lines through unchanged, byte for byte.
package progress

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/term"
)

// IsTerminal reports whether w is a terminal: an *os.File whose descriptor
// is one (golang.org/x/term). Anything else (a buffer, a pipe's writer) is
// not.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Interval is how often the status line is redrawn.
const Interval = 200 * time.Millisecond

// clearLine moves to the start of the line and erases it (ANSI EL).
const clearLine = "\r\x1b[K"

var frames = [...]byte{'|', '/', '-', '\\'}

// Status is a status line on a terminal, or nothing elsewhere. It is an
// io.Writer for the work's own lines: on a terminal each write clears the
// status line, writes the text, and draws the status line again beneath
// it. Its methods are safe for concurrent use; a nil *Status writes
// nothing and stops at once.
type Status struct {
	w     io.Writer
	tty   bool
	label string
	start time.Time

	mu     sync.Mutex
	frame  int
	shown  bool // the status line is on screen
	midway bool // the last write left a line unfinished: draw nothing
	done   bool

	stop    chan struct{}
	stopped chan struct{}
}

// Start shows label on w, with a spinner and the time elapsed, redrawn
// every Interval until Stop, if tty says w is a terminal; if not, the
// Status only passes writes on to w.
func Start(w io.Writer, tty bool, label string) *Status {
	s := &Status{w: w, tty: tty, label: label, start: time.Now()}
	if !tty {
		return s
	}
	s.stop, s.stopped = make(chan struct{}), make(chan struct{})
	s.mu.Lock()
	s.drawLocked()
	s.mu.Unlock()
	go s.run()
	return s
}

func (s *Status) run() {
	defer close(s.stopped)
	t := time.NewTicker(Interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.mu.Lock()
			s.frame++
			s.drawLocked()
			s.mu.Unlock()
		}
	}
}

// drawLocked rewrites the status line, unless a line of the work's is
// unfinished on screen or the Status has stopped.
func (s *Status) drawLocked() {
	if s.midway || s.done {
		return
	}
	fmt.Fprintf(s.w, "%s%c %s %s", clearLine, frames[s.frame%len(frames)], s.label, Elapsed(time.Since(s.start)))
	s.shown = true
}

// Elapsed formats d for the status line: tenths of a second under a
// minute, whole seconds above.
func Elapsed(d time.Duration) string {
	if d < time.Minute {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// Write writes p to the underlying writer: unchanged where it is not a
// terminal; on a terminal after clearing the status line, which it draws
// again after p if p ends a line.
func (s *Status) Write(p []byte) (int, error) {
	if s == nil {
		return len(p), nil
	}
	if !s.tty {
		return s.w.Write(p)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shown {
		io.WriteString(s.w, clearLine)
		s.shown = false
	}
	n, err := s.w.Write(p)
	if len(p) > 0 {
		s.midway = !bytes.HasSuffix(p, []byte("\n"))
	}
	s.drawLocked()
	return n, err
}

// Stop stops redrawing and clears the status line, leaving the terminal
// as if it had never been shown. Stop may be called more than once.
func (s *Status) Stop() {
	if s == nil || !s.tty {
		return
	}
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return
	}
	s.done = true
	if s.shown {
		io.WriteString(s.w, clearLine)
		s.shown = false
	}
	s.mu.Unlock()
	close(s.stop)
	<-s.stopped
}
