package demo

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

// failAfter accepts n writes, then fails as a closed pipe does.
type failAfter struct{ n int }

func (f *failAfter) Write(p []byte) (int, error) {
	if f.n == 0 {
		return 0, syscall.EPIPE
	}
	f.n--
	return len(p), nil
}

// TestReaderGone: the reader of the stories goes away (fence demo | head):
// Run must stop at once with the write's error, having removed what the
// stories made in TMPDIR. Before, it ignored the failed writes and told
// every story to nobody, and returned nil.
func TestReaderGone(t *testing.T) {
	for _, n := range []int{0, 3, 12} {
		tmp := t.TempDir()
		t.Setenv("TMPDIR", tmp)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := Run(ctx, &failAfter{n: n}, Options{SkipFailover: true})
		if !errors.Is(err, syscall.EPIPE) {
			t.Errorf("after %d writes: Run: %v, want the write's error", n, err)
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("after %d writes: %d entries left in TMPDIR, e.g. %s", n, len(left), left[0].Name())
		}
	}
}
