package fence_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/fencekit/fence/internal/redistest"
	"go.uber.org/goleak"
)

// exampleAddr is a redis-server for the examples, which get no *testing.T.
var exampleAddr string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fence-example")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	srv, err := redistest.Launch(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	exampleAddr = srv.Addr
	code := m.Run()
	srv.Kill()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
