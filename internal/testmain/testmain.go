// Package testmain is the TestMain that fence's packages share: it sets up
// what the tests need (a server the examples use, say), runs the tests,
// tears down, and fails the run if goroutines are left behind.
package testmain

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redisserver"
	"go.uber.org/goleak"
)

// Run runs the tests between setup and its teardown, then checks for leaked
// goroutines, and exits. setup may be nil.
func Run(m *testing.M, setup func() (teardown func(), err error)) {
	teardown := func() {}
	if setup != nil {
		var err error
		if teardown, err = setup(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	code := m.Run()
	teardown()
	if code == 0 {
		if err := findLeaks(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// findLeaks is goleak.Find given up to 10 s for goroutines that end by
// themselves shortly after their owner is closed: goleak's own retries
// last about half a second, go-redis's dial probe
// ((*ConnPool).tryDial, started when a pool's dials to a stopped server
// fail) sleeps a second between checks of its closed pool, and a
// redislock parked give-back ends at its parking's next try once its
// client is closed (a second of back-off at most). A fresh-clone CI run
// found one in fencerueidis past a 3 s grace: a closed rueidis client's,
// which kept dialing until its deadline (fixed: TestParkingEndsWithClosedClient);
// 3 s then sufficed, 10 s is kept as a margin for a loaded machine. It
// returns at once when nothing is left.
func findLeaks() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := goleak.Find()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Redis is a setup for Run that starts a redis-server in a temp dir and
// stores its address in addr, for tests and examples that get no
// *testing.T.
func Redis(addr *string) func() (func(), error) {
	return func() (func(), error) {
		srv, err := redisserver.Start("")
		if err != nil {
			return nil, err
		}
		*addr = srv.Addr
		return srv.Close, nil
	}
}
