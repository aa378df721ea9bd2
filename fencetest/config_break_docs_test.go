package fencetest_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/memlock"
)

const configEnv = "FENCETEST_CONFIG"

// TestRunRefusesIncompleteConfig: a backend author who copies the package
// doc's Config but leaves out New, Remove or WatchdogTTL gets one clear
// failure naming the field. Before, a nil Remove panicked in a subtest
// (killing the test binary: "panic: runtime error: invalid memory address
// or nil pointer dereference"), and a zero WatchdogTTL failed subtests as
// if the backend were broken ("lease not done within 0s"...).
func TestRunRefusesIncompleteConfig(t *testing.T) {
	if os.Getenv(configEnv) != "" {
		t.Skip("in a child")
	}
	for c, want := range map[string]string{
		"no-new":      "fencetest: Config.New is nil",
		"no-remove":   "fencetest: Config.Remove is nil",
		"no-watchdog": "fencetest: Config.WatchdogTTL 0s",
	} {
		t.Run(c, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestIncompleteConfigChild$", "-test.v")
			cmd.Env = append(os.Environ(), configEnv+"="+c)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), want) || strings.Contains(string(out), "panic:") {
				t.Fatalf("Run with config %s: err %v, want a failure saying %q and no panic; output:\n%s", c, err, want, out)
			}
		})
	}
}

// TestIncompleteConfigChild is TestRunRefusesIncompleteConfig's child.
func TestIncompleteConfigChild(t *testing.T) {
	c := os.Getenv(configEnv)
	if c == "" {
		t.Skip("run by TestRunRefusesIncompleteConfig")
	}
	newLocker := func(t testing.TB) fence.Locker {
		l, err := memlock.New(&memlock.Options{WatchdogTTL: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	cfg := fencetest.Config{New: newLocker, Remove: func(testing.TB, string) {}, WatchdogTTL: 300 * time.Millisecond}
	switch c {
	case "no-new":
		cfg.New = nil
	case "no-remove":
		cfg.Remove = nil
	case "no-watchdog":
		cfg.WatchdogTTL = 0
	}
	fencetest.Run(t, cfg)
}
