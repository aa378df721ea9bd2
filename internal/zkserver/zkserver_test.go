package zkserver_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/testmain"
	"github.com/fencekit/fence/internal/zkserver"
)

func TestMain(m *testing.M) { testmain.Run(m, nil) }

// A standalone server serves; Close kills it and removes its directory.
func TestStandalone(t *testing.T) {
	start := time.Now()
	s, err := zkserver.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("standalone ready in %v", time.Since(start))
	defer s.Close()
	if mode, err := s.Mode(); err != nil || mode != "standalone" {
		t.Fatalf("Mode() = %q, %v", mode, err)
	}
	if out, err := s.Command("ruok"); err != nil || !strings.Contains(out, "imok") {
		t.Fatalf("ruok = %q, %v", out, err)
	}
	s.Close()
	if _, err := s.Mode(); err == nil {
		t.Fatal("server still answers after Close")
	}
}

// A 3-server ensemble elects a leader; killing it elects another, and the
// killed one rejoins after Restart.
func TestEnsembleLeaderKilled(t *testing.T) {
	start := time.Now()
	e, err := zkserver.StartEnsemble("", 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ensemble ready in %v", time.Since(start))
	defer e.Close()
	leader, err := e.Leader(e.ElectionLimit())
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	killed := time.Now()
	next, err := e.Leader(e.ElectionLimit())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("new leader in %v", time.Since(killed))
	if next == leader {
		t.Fatal("the killed server is still the leader")
	}
	if err := leader.Restart(); err != nil {
		t.Fatal(err)
	}
	if mode, err := leader.Mode(); err != nil || mode != "follower" {
		t.Fatalf("restarted server's Mode() = %q, %v, want follower", mode, err)
	}
}

// Without java on PATH, Start fails naming the install step.
func TestMissingJavaNamesInstallStep(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := zkserver.Start("")
	if err == nil || !strings.Contains(err.Error(), "make deps") || !strings.Contains(err.Error(), "apt-get install") {
		t.Fatalf("Start without java = %v, want the install step", err)
	}
}
