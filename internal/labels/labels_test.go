package labels_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fence/internal/labels"
)

func TestClassesLabel(t *testing.T) {
	c := labels.NewClasses(2)
	for _, tc := range []struct {
		in, want string
		first    bool
	}{
		{"payment", "payment", true},
		{"payment", "payment", false},
		{"caf\xc3", "caf\uFFFD", true},
		{"caf\uFFFD", "caf\uFFFD", false},
		{"order", labels.Other, true},
		{"user", labels.Other, false},
		{"payment", "payment", false},
	} {
		if got, first := c.Label(tc.in); got != tc.want || first != tc.first {
			t.Errorf("Label(%q) = %q, %v; want %q, %v", tc.in, got, first, tc.want, tc.first)
		}
	}
}

// TestSeenFirstOnce: of many goroutines telling one Seen the same values at
// once, exactly one gets First true per value; a read of a known value
// allocates nothing.
func TestSeenFirstOnce(t *testing.T) {
	var s labels.Seen
	values := []string{"redis", "etcd", "zookeeper", "postgres"}
	firsts := make([]atomic.Int32, len(values))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				for i, v := range values {
					if s.First(v) {
						firsts[i].Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	for i := range values {
		if n := firsts[i].Load(); n != 1 {
			t.Errorf("%s: First true %d times, want 1", values[i], n)
		}
	}
	if n := testing.AllocsPerRun(100, func() { s.First("redis") }); n != 0 {
		t.Errorf("First of a known value: %v allocations, want 0", n)
	}
}
