package pgserver

import (
	"testing"

	"github.com/fencekit/fence/internal/testmain"
)

func TestMain(m *testing.M) { testmain.Run(m, nil) }

// Two servers started at once may be handed the same free port: the second
// fails and exits, but the first answers on that port before it does.
// start must never take the other server for its own (its test would use
// the other test's databases): it fails, and Start tries another port.
func TestStartOnTakenPortFails(t *testing.T) {
	taken, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for range 3 {
		// No data directory: this postgres exits at once, as one that
		// cannot bind does, while the other answers.
		s, err := start(taken.bin, taken.dir, taken.dir+"/none", taken.cred, taken.Port)
		if err == nil {
			s.stop()
			t.Fatalf("start on port %d, where another server listens, returned that server as its own", taken.Port)
		}
	}
}
