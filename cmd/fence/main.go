// Command fence takes distributed locks with fencing tokens: fence exec runs
// a command under a lock, fence status shows a lock, and fence demo tells the
// article's stories live. Run "fence help" for the details.
package main

import (
	"os"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
