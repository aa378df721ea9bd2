package classes_test

import (
	"testing"

	"github.com/fencekit/fence/internal/classes"
)

func TestLabel(t *testing.T) {
	s := classes.New(2)
	for _, c := range []struct {
		in, want string
		first    bool
	}{
		{"payment", "payment", true},
		{"payment", "payment", false},
		{"caf\xc3", "caf\uFFFD", true},
		{"caf\uFFFD", "caf\uFFFD", false},
		{"order", classes.Other, true},
		{"user", classes.Other, false},
		{"payment", "payment", false},
	} {
		if got, first := s.Label(c.in); got != c.want || first != c.first {
			t.Errorf("Label(%q) = %q, %v; want %q, %v", c.in, got, first, c.want, c.first)
		}
	}
}
