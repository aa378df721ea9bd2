package cli_test

import (
	"bufio"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/refused"
)

// exec --wait against a server down the whole time, stderr not a terminal:
// fence must say so while it waits, not only at the end of --wait. Since
// go-redis's "failed to dial" lines were dropped (dialNoise) it wrote
// nothing for the whole budget (60 s for --wait 60s), and on a terminal
// its status line "waiting for" read as a lock held by another.
func TestExecWaitServerDownSaysSo(t *testing.T) {
	t.Parallel()
	url := "redis://" + refused.Addr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, fenceBin, "exec", "--redis", url, "--wait", "6s", "lock:x", "--", "true")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	type line struct {
		text string
		at   time.Duration
	}
	var lines []line
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		lines = append(lines, line{sc.Text(), time.Since(start)})
	}
	_ = cmd.Wait()
	ended := time.Since(start)
	t.Logf("exit %d after %v; stderr %v", cmd.ProcessState.ExitCode(), ended.Round(time.Millisecond), lines)
	if len(lines) < 2 {
		t.Fatalf("stderr %v: want a line while waiting, then exec's error", lines)
	}
	first, last := lines[0], lines[len(lines)-1]
	if !strings.Contains(first.text, "connection refused") || first.at > ended/2 {
		t.Errorf("first line %q at %v of %v: want the refusal in the first half of the wait", first.text, first.at.Round(time.Millisecond), ended.Round(time.Millisecond))
	}
	if !strings.HasPrefix(last.text, "fence: lock not acquired") {
		t.Errorf("last line %q: want exec's error", last.text)
	}
	if len(lines) != 2 {
		t.Errorf("stderr %v: want one note while waiting, not one per try", lines)
	}
}
