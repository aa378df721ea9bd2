package demo

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/testmain"
)

func TestMain(m *testing.M) { testmain.Run(m, nil) }

// TestStories runs the stories that need nothing installed and checks that
// the stale worker that writes first charges twice with the article's
// fencing and once with the fenced read-modify-write.
func TestStories(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	if err := Run(ctx, &out, Options{SkipFailover: true}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	stories := strings.Split(out.String(), "\nStory ")
	if len(stories) != 5 {
		t.Fatalf("%d stories, want 4:\n%s", len(stories)-1, out.String())
	}
	for i, want := range []string{"charged twice", "charged once", "charged twice", "charged once"} {
		if !strings.Contains(stories[i+1], want) {
			t.Errorf("story %d lacks %q:\n%s", i+1, want, stories[i+1])
		}
	}
	if !strings.Contains(stories[3], "writes FIRST") || !strings.Contains(stories[4], "guard.Tx") {
		t.Errorf("stories 3 and 4 are not the stale worker writing first:\n%s", out.String())
	}
}
