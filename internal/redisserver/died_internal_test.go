package redisserver

import (
	"strings"
	"syscall"
	"testing"
)

// Died tells a server that exited by a signal of someone else's from one
// stopped by Kill, and carries the end of its log.
func TestDied(t *testing.T) {
	s, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if why := s.Died(); why != "" {
		t.Fatalf("Died of a running server = %q", why)
	}
	s.mu.Lock()
	pid := s.proc.Pid
	s.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-s.exited
	why := s.Died()
	if !strings.Contains(why, "exit status 0") && !strings.Contains(why, "signal: terminated") || !strings.Contains(why, "end of its log") {
		t.Fatalf("Died after SIGTERM = %q", why)
	}
	t.Logf("Died: %s", why)
	s.Kill()
	if why := s.Died(); why != "" {
		t.Fatalf("Died after Kill = %q", why)
	}
}
