package demo

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// cancelOn is a writer that cancels a context when the output reaches a
// line holding all of want: Ctrl-C at that point of a story.
type cancelOn struct {
	mu     sync.Mutex
	out    strings.Builder
	want   []string
	story  string
	cancel context.CancelFunc
}

func (c *cancelOn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out.Write(p)
	s := string(p)
	if strings.HasPrefix(strings.TrimLeft(s, "\n"), "Story ") {
		c.story = s
	}
	if strings.Contains(c.story, c.want[0]) && strings.Contains(s, c.want[1]) {
		c.cancel()
	}
	return len(p), nil
}

// TestInterruptWhileWorkerPaused: Ctrl-C (fence's root cancels the
// command's context) while worker A of a "writes FIRST" story is paused
// past its lease. Worker B's acquisition then fails on the cancelled
// context before it reaches its first step, and A waited for that step
// without a way out: fence demo hung on Ctrl-C (and on any failure of B
// before it locked), its embedded Redis and temp dir left behind. Run must
// return an error matching context.Canceled.
func TestInterruptWhileWorkerPaused(t *testing.T) {
	for _, story := range []string{"writes FIRST, with the article's", "writes FIRST, with the fenced"} {
		t.Run(story, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := &cancelOn{want: []string{story, "lease runs out"}, cancel: cancel}
			done := make(chan error, 1)
			go func() { done <- Run(ctx, w, Options{SkipFailover: true}) }()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("Run: %v, want an error matching context.Canceled", err)
				}
			case <-time.After(30 * time.Second):
				w.mu.Lock()
				defer w.mu.Unlock()
				t.Fatalf("Run hung after Ctrl-C while A was paused:\n%s", w.out.String())
			}
		})
	}
}
