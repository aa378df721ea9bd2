package redisserver

import (
	"errors"
	"net"
	"os/exec"
	"testing"
)

// Two servers started at once may be handed the same free port: the second
// fails to bind and exits, but the first answers PING on that port before
// it does. start must never take the other server for its own (its test
// would share it, locks and all): it fails, and launch tries another port.
func TestStartOnTakenPortFails(t *testing.T) {
	taken, err := Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(taken.Addr)
	for range 5 {
		s := &Server{Dir: t.TempDir(), bin: bin, Addr: taken.Addr,
			args: []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}}
		if err := s.start(); err == nil {
			s.Close()
			t.Fatalf("start on %s, where another server listens, returned that server as its own", taken.Addr)
		}
	}
	// The check itself, with the process still alive: another pid answers.
	never := make(chan struct{})
	if err := waitReady(taken.options(), never, taken.proc.Pid+1); !errors.Is(err, errPortTaken) {
		t.Fatalf("waitReady for another pid = %v, want errPortTaken", err)
	}
	if err := waitReady(taken.options(), never, taken.proc.Pid); err != nil {
		t.Fatalf("waitReady for the server's own pid = %v", err)
	}
}
