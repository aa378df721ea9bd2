package zkserver

import (
	"errors"
	"testing"
	"time"
)

// Two servers started at once may be handed the same free port: the second
// fails to bind and exits, but the first serves on that port before it
// does. waitReady must never take the other server for its own (its test
// would share the other test's sessions and nodes): it fails, and Start
// tries other ports.
func TestStartOnTakenPortFails(t *testing.T) {
	taken, err := Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	s := &Server{Addr: taken.Addr, java: taken.java, Dir: t.TempDir()}
	if err := s.writeConfig(nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.launch(); err != nil {
		t.Fatal(err)
	}
	defer s.Kill()
	if err := s.waitReady(time.Now().Add(readyTimeout)); !errors.Is(err, errPortTaken) {
		t.Fatalf("waitReady on %s, where another server serves = %v, want errPortTaken", taken.Addr, err)
	}
}
